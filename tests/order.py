"""The order the suite's modules start in: the slowest first.

On pytest-xdist workers with `--dist loadfile` (tests/run.py) xdist starts the modules with the
most tests first, in collection order among modules of one size; run serially (`pytest -p
no:xdist`, tests/flakes.py), the collection order is the order. A slow module that comes last
runs alone at the end while the others sit idle.
Starting the slowest modules first (the longest-processing-time rule) leaves the short ones to
fill in at the end. How slow a module is comes from tests/durations.txt, the slowest tests of a
CI run: the modules named there, by their summed seconds, come first; the others keep their
order after them. Tests within a module keep theirs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

DURATIONS = Path(__file__).resolve().parent / "durations.txt"
_LINE = re.compile(r"^\s*([0-9.]+)s\s+(?:call|setup|teardown)\s+([^:\s]+)::")


class _Item(Protocol):
    nodeid: str


T = TypeVar("T", bound=_Item)


def module_seconds(text: str) -> dict[str, float]:
    """Summed seconds per module (its path) of the durations report in `text`."""
    seconds: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    return dict(seconds)


def slowest_modules_first(items: Sequence[T], seconds: dict[str, float]) -> list[T]:
    """`items` with their modules reordered, the slowest (by `seconds`) first; a module not in
    `seconds` keeps its place among the others, after them; each module's tests keep theirs."""
    modules: dict[str, list[T]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(enumerate(modules), key=lambda im: (-seconds.get(im[1], 0.0), im[0]))
    return [item for _, module in order for item in modules[module]]


def read_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """module_seconds of tests/durations.txt ({} when it is missing)."""
    try:
        return module_seconds(path.read_text())
    except OSError:
        return {}
