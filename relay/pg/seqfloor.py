"""Where the unkeyed claim starts: above the rows the relay has already moved, most of the time.

The claim walks the outbox's `seq` index from its start. Every row the relay deleted stays in
that index until VACUUM removes it, and VACUUM can remove none of them while any transaction
in the database is older than the delete (a report, a stuck session, a REPEATABLE READ
snapshot: "the xmin horizon is pinned"). Then each claim steps over every row deleted since, and
a backlog drains in time that grows with its square (500,000 rows: 0.70x the unpinned rate).

So a claim starts at a *floor*: the lowest `seq` that some claim at least `LAG_S` ago got back.
Below that floor, at that time, every row was either claimed (and is being published by one
lane or another), not yet committed, or not due yet. The rows that can still turn up below it
are the exceptions: a producer transaction that committed more than `LAG_S` after its INSERT,
a retried or delayed row coming due, rows a failed batch or a dead relay released. A periodic
*rescan* claims from the very start to find those: at least every `RESCAN_EVERY_S`, and less
often when a rescan is expensive (a rescan may take at most `RESCAN_SHARE` of the time), at
once after a floored claim found nothing, and whenever there is no floor old enough. A rescan
that finds a row below the floor drops every floor (they wait `LAG_S` again). (A *sweep* is
something else: the claims a wake-up runs until the backlog is drained.)

While a backlog drains, a claim's *fill* (the rows in seq order, after the fair round) starts
higher still: above the highest row this relay's fill took (`fill_start`), so that a claim does
not walk the rows the relay's other lanes hold; and, unless it rescans (`shares`), above the
table's *shared frontier*, the highest row any relay's full claim filled up to (a sequence in
the database, sql/migrations/0027_shared_fill_frontier.sql), so that it does not walk the rows
the other relays hold either. Rows other claims hold were each read, and skipped, by every
claim below them: with 4 relays of 3 lanes, 6,000 rows in flight, a claim of 500 read up to
6,064 rows. A batch that gives rows back (rolled back, retried, recurring) and a claim that
comes back short start the next fill at the floor again, and set the shared frontier back
too; rows otherwise left below the frontiers (a delayed row come due, a late commit, the rows
of a relay that died) are the fair round's or the rescan's.

Pure bookkeeping, no I/O: the store asks `start()` and `fill_start()` before each claim and
tells `claimed()` and `filled()` what came back.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# A claim from the very start of the index: every seq is >= this.
FROM_START = -(2**63)
LAG_S = 1.0
RESCAN_EVERY_S = 1.0
RESCAN_SHARE = 0.05


class SeqFloor:
    """The floor of the next unkeyed claim, shared by the lanes of one relay process."""

    def __init__(self, *, lag_s: float = LAG_S, rescan_every_s: float = RESCAN_EVERY_S,
                 rescan_share: float = RESCAN_SHARE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lag_s = lag_s
        self._rescan_every_s = rescan_every_s
        self._rescan_share = rescan_share
        self._clock = clock
        # (when, lowest seq a claim got back), oldest first.
        self._marks: deque[tuple[float, int]] = deque()
        self._rescan_at = 0.0  # the first claim rescans
        self.rescans = 0
        # While a backlog drains: the highest seq this relay's fill took (None: no backlog).
        self._frontier: int | None = None
        self._rescanning = True  # what the last start() said

    def start(self) -> int:
        """The lowest seq the next claim may return (FROM_START: from the start of the index)."""
        now = self._clock()
        self._rescanning = now >= self._rescan_at
        if self._rescanning:
            return FROM_START
        floor = self._floor(now)
        return FROM_START if floor is None else floor

    def fill_start(self, start: int) -> int:
        """Where the claim's fill begins, given what start() just returned: above the frontier
        while a backlog drains, at `start` otherwise and when start() began a rescan."""
        if self._rescanning or self._frontier is None:
            return start
        return max(start, self._frontier + 1)

    def shares(self) -> bool:
        """The claim start() just began may also start its fill above the table's shared
        frontier (what every relay's full claims filled up to): not when it rescans."""
        return not self._rescanning

    def filled(self, highest: int | None, full: bool) -> None:
        """A claim's fill took rows up to `highest` (None: none); `full`: the batch was."""
        if not full:
            self._frontier = None
        elif highest is not None:
            self._frontier = highest if self._frontier is None else max(self._frontier, highest)

    def released(self) -> None:
        """A batch gave rows back (rolled back, retried, recurring): the next fill starts at
        the floor again, so that they are not left below the frontier."""
        self._frontier = None

    def claimed(self, floor: int, lowest: int | None, elapsed_s: float) -> None:
        """A claim that started at `floor` took `elapsed_s` and got back rows from `lowest` up
        (None: no unkeyed row)."""
        now = self._clock()
        if floor == FROM_START:
            self.rescans += 1
            self._rescan_at = now + max(self._rescan_every_s, elapsed_s / self._rescan_share)
            current = self._floor(now)
            if lowest is not None and current is not None and lowest < current:
                self._marks.clear()
        elif lowest is None:
            # Nothing above the floor: whatever is due lies below it (or nothing is).
            self._rescan_at = 0.0
        if lowest is not None:
            self._marks.append((now, lowest))
        self._prune(now)

    def _floor(self, now: float) -> int | None:
        """The newest mark at least LAG_S old."""
        found = None
        for when, seq in self._marks:
            if now - when < self._lag_s:
                break
            found = seq
        return found

    def _prune(self, now: float) -> None:
        """Keep the newest mark older than LAG_S and every younger one."""
        while len(self._marks) > 1 and now - self._marks[1][0] >= self._lag_s:
            self._marks.popleft()
