"""When the worker goes back to sleep (docs/notify.md, "When a relay sleeps").

At a trickle a relay sleeps holding the wake-up lock and producers notify: a NOTIFY costs
them nothing while few commit at once, and the relay wakes the instant a row commits instead
of polling. Under a heavy flow a NOTIFY would serialise the producers' commits, so while each
drain brings back more than a handful of rows the relay does not sleep at all: it sweeps again
at once, holding no lock, and producers skip the NOTIFY. The first drain that brings back fewer
sends it back to the sleep path, which checks once more for rows before sleeping.
"""

from __future__ import annotations

# Rows one wake-up's drain must bring back for the relay to sweep again without sleeping.
# At a trickle (1,000 commits/s, ~3 ms per wake-up) a drain brings 1-5 rows; with 8 producers
# committing as fast as they can it brings tens.
BUSY_DRAIN_ROWS = 16


def keep_sweeping(rows_this_wakeup: int) -> bool:
    """Sweep again at once instead of going to sleep."""
    return rows_this_wakeup >= BUSY_DRAIN_ROWS
