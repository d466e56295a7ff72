"""A pytest plugin for tests/unit/test_run_split.py: with `--collect-only -p
tests.kit.marks_listing`, prints a line per collected test, its node id and the names of its
marks, so that one collection answers what several `-m` selections would."""

from __future__ import annotations

import pytest

PREFIX = "MARKS "


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        marks = sorted({mark.name for mark in item.iter_markers()})
        print(f"{PREFIX}{item.nodeid} {','.join(marks)}")
