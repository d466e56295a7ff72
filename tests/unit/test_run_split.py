"""The suite's parts (tests/run.py): together they hold every test once, and their exit
statuses make one."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests import run


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


def _collected(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:xdist", *args],
                         cwd=run.REPO, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if re.match(r"tests/\S+::", line)}


def test_parts__hold_every_test_of_the_suite_once() -> None:
    everything = _collected()
    selections = [_collected("-m", marks) for _, marks, _ in run.parts([])]
    assert len(everything) > 800, len(everything)
    assert sum(len(s) for s in selections) == len(everything), [len(s) for s in selections]
    assert set().union(*selections) == everything
    assert all(selections), [len(s) for s in selections]


def test_parts__the_alone_tests_run_without_workers_and_the_others_on_three() -> None:
    commands = {marks: command for _, marks, command in run.parts(["-q"])}
    alone = commands[run.ALONE]
    assert alone[alone.index("-p") + 1] == "no:xdist"
    others = [c for m, c in commands.items() if m != run.ALONE]
    assert len(others) == 1
    assert all(c[c.index("-n") + 1] == str(run.WORKERS) for c in others)
    assert all(c[c.index("--dist") + 1] == "loadfile" for c in others)
    assert all(c[-1] == "-q" for c in commands.values())


def test_timing_mark__selects_tests_of_integration_and_chaos_for_the_flake_finder() -> None:
    """tests/flakes.py's documented run (`-m timing tests/integration tests/chaos`) has tests."""
    timed = _collected("-m", "timing", "tests/integration", "tests/chaos")
    assert {t.split("/")[1] for t in timed} == {"integration", "chaos"}, sorted(timed)
    assert len(timed) >= 20, len(timed)
