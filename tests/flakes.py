"""The flake finder: run chosen tests several rounds with CPU hogs (one by default, on one core:
the load another pytest worker or another CI run puts on this 2-core machine; `--hogs 2`, one
on each core: about what the suite's three workers put beside a test) and list every test that
ever failed, with how often.

    .venv/bin/python tests/flakes.py --rounds 5 tests/integration/test_fair_claims.py
    .venv/bin/python tests/flakes.py --rounds 5 -m timing tests/integration tests/chaos tests/ha
    .venv/bin/python tests/flakes.py --hogs 2 --rounds 2 -m timing tests/integration tests/chaos
    .venv/bin/python tests/flakes.py --no-hog --rounds 3 tests/integration/test_migrate.py

Every argument after the options goes to pytest (paths, -k, -m). The tests run on one process
(no xdist), as the suite's second part does, against the machine's servers. Exit status 0 only
when no test failed in any round. A hog is a busy loop pinned to one CPU (the first on CPU 0,
the next on CPU 1, ...), started before the first round and stopped after the last, also when
the run is interrupted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOG = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def failures(junit: Path) -> tuple[int, list[tuple[str, str]]]:
    """Tests run, and those that failed or errored in one round's JUnit XML report with the
    first line of why."""
    root = ET.parse(junit).getroot()  # noqa: S314 - the report our own pytest just wrote
    ran = 0
    failed = []
    for case in root.iter("testcase"):
        ran += 1
        fault = case.find("failure")
        fault = fault if fault is not None else case.find("error")
        if fault is not None:
            why = (fault.get("message") or "").splitlines()[:1]
            failed.append((f"{case.get('classname')}::{case.get('name')}",
                           why[0][:300] if why else ""))
    return ran, failed


def main() -> int:
    parser = argparse.ArgumentParser(prog="python tests/flakes.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds to run (default 5)")
    parser.add_argument("--hogs", type=int, default=1,
                        help="busy loops, one per CPU from CPU 0 (default 1)")
    parser.add_argument("--no-hog", action="store_true", help="run without a CPU hog")
    args, pytest_args = parser.parse_known_args()
    if not pytest_args:
        parser.error("give the tests to run (paths, -k or -m, as for pytest)")
    cpus = sorted(os.sched_getaffinity(0))
    hogs = [] if args.no_hog else [
        subprocess.Popen([sys.executable, "-c", HOG, str(cpus[n % len(cpus)])])
        for n in range(args.hogs)]
    seen: Counter[str] = Counter()
    ran_total = 0
    try:
        with tempfile.TemporaryDirectory(prefix="flakes-") as tmp:
            for number in range(1, args.rounds + 1):
                junit = Path(tmp) / f"round-{number}.xml"
                started = time.monotonic()
                subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-q",
                                "-p", "no:cacheprovider", f"--junitxml={junit}",
                                *pytest_args], cwd=REPO, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                ran, failed = failures(junit) if junit.exists() else (0, [("(no report)", "")])
                ran_total += ran
                seen.update(name for name, _ in failed)
                print(f"round {number}/{args.rounds}: {ran} tests, {len(failed)} failed, "
                      f"{time.monotonic() - started:.0f} s"
                      f"{' (load ' + str(os.getloadavg()[0]) + ')' if failed else ''}",
                      flush=True)
                for name, why in failed:
                    print(f"  FAILED {name}" + (f" - {why}" if why else ""), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    under = f" under {len(hogs)} CPU hog(s), one per core" if hogs else ""
    print(f"{args.rounds} rounds{under}: "
          f"{ran_total} test runs, {sum(seen.values())} failures")
    for name, count in seen.most_common():
        print(f"  {count}/{args.rounds}  {name}")
    return 1 if seen or ran_total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
