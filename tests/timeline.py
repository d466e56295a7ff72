"""Where the suite's wall clock went: read the per-worker timeline the tests wrote
(RELAY_TEST_TIMELINE, tests/conftest.py; tests/run.py writes it to .ci/out/timeline/<part>)
and print, for each worker, how long it was busy and how long it sat idle at the end while
another still ran, and the units it ran (a module, or the local Spark session's modules,
tests/xdist_units.py) that took 20 s or more, and its last, in order, with start and seconds.

    .venv/bin/python tests/timeline.py .ci/out/timeline/part-1
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.xdist_units import unit_of


@dataclass
class Span:
    """One unit's run on one worker: from its first test's start to its last test's end."""

    unit: str
    start: float
    end: float
    tests: int = 1


def spans(path: Path) -> list[Span]:
    """The units of one worker's file, in the order they ran (a unit split by another's tests
    counts as two spans)."""
    out: list[Span] = []
    for line in path.read_text().splitlines():
        start_s, end_s, nodeid = line.split("\t", 2)
        unit = unit_of(nodeid)
        if out and out[-1].unit == unit:
            out[-1].end, out[-1].tests = float(end_s), out[-1].tests + 1
        else:
            out.append(Span(unit, float(start_s), float(end_s)))
    return out


def report(directory: Path, min_s: float = 20.0) -> str:
    """The timeline's summary as text (empty when there is none): each worker's units of at
    least `min_s`, and its last, in the order they ran."""
    workers = {p.stem: spans(p) for p in sorted(directory.glob("*.tsv"))}
    workers = {w: s for w, s in workers.items() if s}
    if not workers:
        return ""
    t0 = min(s[0].start for s in workers.values())
    t_end = max(s[-1].end for s in workers.values())
    lines = [f"timeline of {directory}: {t_end - t0:.0f} s from the first test's start"]
    for worker, units in workers.items():
        busy = sum(u.end - u.start for u in units)
        lines.append(f"  {worker}: {len(units)} units, busy {busy:.0f} s, done at "
                     f"{units[-1].end - t0:.0f} s (idle {t_end - units[-1].end:.0f} s at the end)")
        for u in units:
            if u.end - u.start < min_s and u is not units[-1]:
                continue
            lines.append(f"    {u.start - t0:6.0f} s +{u.end - u.start:5.0f} s  {u.unit} "
                         f"({u.tests} tests)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])) or f"no timeline in {sys.argv[1]}")
