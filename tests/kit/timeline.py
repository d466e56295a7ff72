"""A pytest plugin that writes when each test ran and on which worker, for finding where a
run on several workers sits idle: `-p tests.kit.timeline` with TESTS_TIMELINE=<file> appends a
line per test, `<worker> <start> <stop> <outcome> <node id>` (seconds since the epoch).
`python -m tests.kit.timeline <file>` prints each worker's busy time and the run's tail."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "TESTS_TIMELINE"
_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed or report.when == "call":
        _outcomes.setdefault(report.nodeid, report.outcome)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> object:
    started = time.time()
    yield
    path = os.environ.get(ENV)
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a", encoding="utf-8") as out:
            outcome = _outcomes.pop(item.nodeid, "skipped")
            out.write(f"{worker} {started:.3f} {time.time():.3f} {outcome} {item.nodeid}\n")


def report(text: str) -> str:
    """Each worker's busy seconds and when it ran out of tests; the modules that ran last."""
    runs: list[tuple[str, float, float, str, str]] = []
    for line in text.splitlines():
        worker, start, stop, outcome, nodeid = line.split(" ", 4)
        runs.append((worker, float(start), float(stop), nodeid, outcome))
    t0 = min(r[1] for r in runs)
    out = []
    by_worker: dict[str, list[tuple[str, float, float, str, str]]] = defaultdict(list)
    for run in runs:
        by_worker[run[0]].append(run)
    for worker, rs in sorted(by_worker.items()):
        busy = sum(r[2] - r[1] for r in rs)
        out.append(f"{worker}: {len(rs)} tests, busy {busy:.0f} s, last ended at "
                   f"{max(r[2] for r in rs) - t0:.0f} s")
    modules: dict[str, list[float]] = {}
    for _, start, stop, nodeid, _ in runs:
        span = modules.setdefault(nodeid.split("::")[0], [start, stop])
        span[0], span[1] = min(span[0], start), max(span[1], stop)
    out.extend(f"{r[4]}: {r[3]}" for r in runs if r[4] != "passed")
    out.append("modules by when they ended (start-end s, the last 15):")
    for module, (start, stop) in sorted(modules.items(), key=lambda m: m[1][1])[-15:]:
        out.append(f"  {start - t0:6.0f} {stop - t0:6.0f} {module}")
    return "\n".join(out)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]).read_text(encoding="utf-8")))
