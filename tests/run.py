"""The whole suite as CI runs it, in two parts, on the machine's servers:

1. every test that shares nothing server-wide with another (each has a database, an exchange
   and a queue of its own) on two pytest-xdist workers, a test module per worker at a time;
2. then, one at a time with nothing beside them, the tests that restart, cut or load what every
   test shares: the chaos, HA and soak tests, the Spark jobs and those marked `alone`.

    .venv/bin/python tests/run.py -q -rfEs        # the suite (README's test command)
    .venv/bin/python tests/run.py -q tests/unit   # the same split over a part of it

Options are pytest's and go to both parts. Exit status 0 only when both parts passed (a part
that the given paths leave empty counts as passed, unless both are empty). `pytest` itself
still runs any part by hand, on one process.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The marks of the tests that must run with nothing beside them (pyproject.toml's markers).
SHARED = "chaos or ha or soak or spark or alone"
WORKERS = 2
NO_TESTS_COLLECTED = 5  # pytest's exit status when the selection is empty


def parts(args: list[str]) -> list[tuple[str, str, list[str]]]:
    """Both parts: name, mark expression and pytest command line."""
    pytest = [sys.executable, "-m", "pytest"]
    together, alone = f"not ({SHARED})", SHARED
    return [
        (f"on {WORKERS} workers", together,
         [*pytest, "-n", str(WORKERS), "--dist", "loadfile", "-m", together, *args]),
        ("one at a time", alone, [*pytest, "-p", "no:xdist", "-m", alone, *args]),
    ]


def outcome(statuses: list[int]) -> int:
    """Both parts' exit statuses as one: 0 when each passed or was empty, not both empty."""
    if all(s == NO_TESTS_COLLECTED for s in statuses):
        return NO_TESTS_COLLECTED
    failed = [s for s in statuses if s not in (0, NO_TESTS_COLLECTED)]
    return failed[0] if failed else 0


def main(args: list[str]) -> int:
    """Run both parts in turn (the second even when the first failed: one report of all)."""
    statuses = []
    for how, marks, command in parts(args):
        name = f"{how} ({marks})"
        print(f"==> tests, {name}", flush=True)
        started = time.monotonic()
        status = subprocess.run(command, cwd=REPO, check=False).returncode
        print(f"==> tests, {name}: exit {status} after {time.monotonic() - started:.0f} s",
              flush=True)
        statuses.append(status)
    return outcome(statuses)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
