"""tests/kit/timeline.py: each worker's busy time, the failures, the modules that ended last."""

from __future__ import annotations

from tests.kit.timeline import report

LINES = """\
gw0 100.0 110.0 passed tests/unit/test_a.py::test_one
gw0 110.0 130.0 failed tests/unit/test_a.py::test_two
gw1 100.0 190.0 passed tests/spark/test_b.py::test_long
"""


def test_report__busy_seconds_per_worker_failures_and_modules_by_end() -> None:
    lines = report(LINES).splitlines()
    assert lines[0] == "gw0: 2 tests, busy 30 s, last ended at 30 s"
    assert lines[1] == "gw1: 1 tests, busy 90 s, last ended at 90 s"
    assert lines[2] == "failed: tests/unit/test_a.py::test_two"
    assert [line.split()[-1] for line in lines[4:]] == ["tests/unit/test_a.py",
                                                       "tests/spark/test_b.py"]
