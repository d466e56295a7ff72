"""The suite's parts (tests/run.py): together they hold every test once, and their exit
statuses make one."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from _pytest.mark.expression import Expression

from tests import run
from tests.kit import marks_listing


@pytest.mark.parametrize(("statuses", "expected"), [
    ([0, 0], 0),
    ([0, 5], 0),
    ([5, 0], 0),
    ([5, 5], 5),
    ([1, 0], 1),
    ([0, 1], 1),
    ([5, 2], 2),
    ([1, 2], 1),
    ([0, 0, 0], 0),
    ([5, 5, 0], 0),
    ([5, 5, 5], 5),
    ([0, 0, 1], 1),
])
def test_outcome__passes_only_when_each_part_passed_or_was_empty(
    statuses: list[int], expected: int
) -> None:
    assert run.outcome(statuses) == expected


def _collected() -> dict[str, set[str]]:
    """Every test of the suite with the names of its marks, from one collection."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:xdist", "-p", "tests.kit.marks_listing"],
                         cwd=run.REPO, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    tests = {}
    for line in out.stdout.splitlines():
        if line.startswith(marks_listing.PREFIX):
            nodeid, _, marks = line.removeprefix(marks_listing.PREFIX).rpartition(" ")
            tests[nodeid] = set(filter(None, marks.split(",")))
    return tests


def _selected(tests: dict[str, set[str]], expression: str) -> set[str]:
    """The tests `-m expression` selects (pytest's own evaluation of the expression)."""
    compiled = Expression.compile(expression)

    def matches(marks: set[str]) -> bool:
        return compiled.evaluate(lambda name, /, **_: name in marks)

    return {t for t, marks in tests.items() if matches(marks)}


@pytest.fixture(scope="module")
def suite() -> dict[str, set[str]]:
    return _collected()


def test_marks_listing__selects_what_pytest_m_selects(suite: dict[str, set[str]]) -> None:
    """The listing's answer for one expression is pytest's own `-m` (run once, on a part)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:xdist", "-m", "alone or timing", "tests/chaos"],
                         cwd=run.REPO, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    by_pytest = {line for line in out.stdout.splitlines() if re.match(r"tests/\S+::", line)}
    chaos = {t: m for t, m in suite.items() if t.startswith("tests/chaos/")}
    assert by_pytest
    assert by_pytest == _selected(chaos, "alone or timing")


def test_parts__hold_every_test_of_the_suite_once(suite: dict[str, set[str]]) -> None:
    everything = set(suite)
    selections = [_selected(suite, marks) for _, marks, _ in run.parts([])]
    assert len(everything) > 800, len(everything)
    assert sum(len(s) for s in selections) == len(everything), [len(s) for s in selections]
    assert set().union(*selections) == everything
    assert all(selections), [len(s) for s in selections]


def test_parts__the_alone_tests_run_without_workers_and_the_others_on_three() -> None:
    commands = {marks: command for _, marks, command in run.parts(["-q"])}
    alone = commands[run.ALONE]
    assert "no:xdist" in [alone[i + 1] for i, a in enumerate(alone) if a == "-p"]
    assert all("tests.kit.timeline" in c for c in commands.values()), "each part's timeline"
    others = [c for m, c in commands.items() if m != run.ALONE]
    assert len(others) == 1
    assert all(c[c.index("-n") + 1] == str(run.WORKERS) for c in others)
    assert all(c[c.index("--dist") + 1] == "loadfile" for c in others)
    assert all(c[-1] == "-q" for c in commands.values())


def test_timing_mark__selects_tests_of_integration_and_chaos_for_the_flake_finder(
    suite: dict[str, set[str]],
) -> None:
    """tests/flakes.py's documented run (`-m timing tests/integration tests/chaos`) has tests."""
    timed = {t for t in _selected(suite, "timing")
             if t.startswith(("tests/integration/", "tests/chaos/"))}
    assert {t.split("/")[1] for t in timed} == {"integration", "chaos"}, sorted(timed)
    assert len(timed) >= 20, len(timed)
