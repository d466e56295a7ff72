"""The whole suite as CI runs it, in two parts, on the machine's servers:

1. every test but those marked `alone`, on three pytest-xdist workers, a test module per worker
   at a time (xdist starts the modules with the most tests first; tests/order.py's slowest-first
   collection order decides between modules of one size). Each test has a database, an
   exchange and a queue of its own, and the fault tests (chaos, HA, soak) and Spark jobs cut,
   restart or kill only what they started (relays, proxies, private RabbitMQ nodes and
   PostgreSQL clusters, Spark JVMs). Much of the suite's time is spent waiting for a timeout:
   on two workers, in two parts (the fault tests and Spark jobs after the rest), the CPU sat a
   third idle in the first part (703 + 666 s); on three workers, in one part, 840 s with the
   CPU 88% busy. Starting the slowest modules first instead (`--no-loadscope-reorder`) put
   the Spark jobs and the fault tests side by side: 990 s, and four fault tests failed;
2. then, one at a time with nothing beside them, the tests marked `alone`: they change or load
   what every test shares (every stream connection of the broker, the whole machine).

    .venv/bin/python tests/run.py -q -rfEs        # the suite (README's test command)
    .venv/bin/python tests/run.py -q tests/unit   # the same split over a part of it

Options are pytest's and go to every part. Exit status 0 only when every part passed (a part
that the given paths leave empty counts as passed, unless all are empty). `pytest` itself
still runs any part by hand, on one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.kit import timeline as timeline_plugin  # noqa: E402

# Each part's timeline: which worker ran which test when (tests/kit/timeline.py).
TIMELINES = REPO / ".ci" / "out" / "timeline"
# The mark of the tests that must run with nothing beside them (pyproject.toml's markers).
ALONE = "alone"
WORKERS = 3
NO_TESTS_COLLECTED = 5  # pytest's exit status when the selection is empty


def parts(args: list[str]) -> list[tuple[str, str, list[str]]]:
    """Every part: name, mark expression and pytest command line (each writes its timeline,
    tests/kit/timeline.py)."""
    pytest = [sys.executable, "-m", "pytest", "-p", "tests.kit.timeline"]
    workers = [*pytest, "-n", str(WORKERS), "--dist", "loadfile"]
    together = f"not {ALONE}"
    return [
        (f"on {WORKERS} workers", together, [*workers, "-m", together, *args]),
        ("one at a time", ALONE, [*pytest, "-p", "no:xdist", "-m", ALONE, *args]),
    ]


def outcome(statuses: list[int]) -> int:
    """The parts' exit statuses as one: 0 when each passed or was empty, not all empty."""
    if all(s == NO_TESTS_COLLECTED for s in statuses):
        return NO_TESTS_COLLECTED
    failed = [s for s in statuses if s not in (0, NO_TESTS_COLLECTED)]
    return failed[0] if failed else 0


def main(args: list[str]) -> int:
    """Run the parts in turn (the later ones even when one failed: one report of all)."""
    statuses = []
    for number, (how, marks, command) in enumerate(parts(args), 1):
        name = f"{how} ({marks})"
        print(f"==> tests, {name}", flush=True)
        started = time.monotonic()
        timeline = TIMELINES / f"part-{number}.txt"
        timeline.parent.mkdir(parents=True, exist_ok=True)
        timeline.unlink(missing_ok=True)
        env = {**os.environ, timeline_plugin.ENV: str(timeline)}
        status = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
        print(f"==> tests, {name}: exit {status} after {time.monotonic() - started:.0f} s",
              flush=True)
        if number == 1 and timeline.exists():
            print(f"==> where part 1's time went ({timeline.relative_to(REPO)}):\n"
                  f"{timeline_plugin.report(timeline.read_text(encoding='utf-8'))}", flush=True)
        statuses.append(status)
    return outcome(statuses)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
