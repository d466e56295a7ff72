"""The suite's modules start slowest first (tests/order.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.order import DURATIONS, module_seconds, read_seconds, slowest_modules_first

REPORT = """\
============================= slowest 25 durations =============================
75.28s call     tests/a/test_fast.py::test_x
150.31s call     tests/spark/test_slow.py::test_y
22.38s setup    tests/ha/test_mid.py::test_z[one]
13.49s call     tests/ha/test_mid.py::test_z[two]
(99 durations < 0.005s hidden.  Use -vv to show these durations.)
789 passed in 662.26s (0:11:02)
"""


@dataclass
class Item:
    nodeid: str


def test_module_seconds__sums_calls_and_setups_per_module() -> None:
    assert module_seconds(REPORT) == {"tests/a/test_fast.py": 75.28,
                                      "tests/spark/test_slow.py": 150.31,
                                      "tests/ha/test_mid.py": 22.38 + 13.49}


def test_slowest_modules_first__known_modules_by_seconds_then_the_rest_in_order() -> None:
    items = [Item(n) for n in ("tests/a/test_fast.py::test_x", "tests/b/test_new.py::t1",
                               "tests/ha/test_mid.py::test_z[one]", "tests/c/test_new.py::t2",
                               "tests/ha/test_mid.py::test_z[two]", "tests/b/test_new.py::t3",
                               "tests/spark/test_slow.py::test_y")]
    ordered = [i.nodeid for i in slowest_modules_first(items, module_seconds(REPORT))]
    assert ordered == ["tests/spark/test_slow.py::test_y", "tests/a/test_fast.py::test_x",
                       "tests/ha/test_mid.py::test_z[one]", "tests/ha/test_mid.py::test_z[two]",
                       "tests/b/test_new.py::t1", "tests/b/test_new.py::t3",
                       "tests/c/test_new.py::t2"]


def test_read_seconds__the_suite_file_names_modules_that_exist() -> None:
    seconds = read_seconds()
    assert len(seconds) >= 10, seconds
    root = DURATIONS.parent.parent
    assert all((root / module).is_file() for module in seconds), sorted(seconds)
