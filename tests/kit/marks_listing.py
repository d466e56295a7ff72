"""A pytest plugin for tests/unit/test_run_split.py and tests/unit/test_xdist_units.py: with
`--collect-only -p tests.kit.marks_listing`, prints a line per collected test, its node id and
the names of its marks, and another with the names of the fixtures it uses, so that one
collection answers what several `-m` selections would."""

from __future__ import annotations

import pytest

PREFIX = "MARKS "
FIXTURES = "FIXTURES "


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        marks = sorted({mark.name for mark in item.iter_markers()})
        print(f"{PREFIX}{item.nodeid} {','.join(marks)}")
        print(f"{FIXTURES}{item.nodeid} {','.join(sorted(getattr(item, 'fixturenames', ())))}")
