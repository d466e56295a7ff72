"""Output for people: tables, and progress that updates in place on a terminal.

Off a terminal, progress is a log event per step (JSON on stderr), never a stray text line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import structlog

log = structlog.get_logger("relay.cli")


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], width: int) -> None:
    """Rows as aligned columns under upper-case headers; long cells cut with an ellipsis."""
    cells = [[str(r[c]) if r[c] is not None else "" for c in columns] for r in rows]
    cells = [[v if len(v) <= width else v[: width - 1] + "…" for v in row] for row in cells]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


class Progress:
    """`verb done of total` for a long operation: in place on a terminal, else log events.

    Log events are rate-limited to one per `every_s` (and the last one), so a million-row
    replay does not write a million lines.
    """

    def __init__(self, verb: str, every_s: float = 1.0) -> None:
        self.verb = verb
        self.every_s = every_s
        self.tty = sys.stderr.isatty()
        self._last = 0.0
        self._started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        final = done >= total
        if not final and now - self._last < self.every_s:
            return
        self._last = now
        rate = done / max(now - self._started, 1e-6)
        if self.tty:
            end = "\n" if final else ""
            print(f"\r{self.verb} {done} of {total} ({rate:.0f}/s)", end=end, file=sys.stderr,
                  flush=True)
        else:
            log.info("progress", operation=self.verb, done=done, total=total,
                     rate_per_s=round(rate, 1))
