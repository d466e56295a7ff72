"""The outbox's statistics refreshed when a backlog begins that they do not count.

Every plan of a claim rests on the table's statistics. Autovacuum records a drained outbox
with `reltuples` 0, and when it cannot truncate the table (relays use it) the pages stay: the
planner then expects no rows however many come, and each claim of the bulk that follows walks
and sorts all of it, until autoanalyze comes round (a minute or more). When a relay's claims go
from short batches to full ones, it asks the server, after that claim's batch and before the next
claim, to analyze the table if the statistics count fewer rows than the claim took (one short
look at pg_class when they are right); the ANALYZE makes every session of every relay plan again
(sql/migrations/0025_statistics_refresh.sql). Never on a trickle of short batches: the latency
path pays nothing.
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg
import structlog

from relay.pg.queries import Queries

log = structlog.get_logger(__name__)

# What the ANALYZE may meet that is no reason to fail the claim after it: a role not granted the
# function (roles made by hand), a schema older than the relay (caught elsewhere), a statement
# timeout.
NOT_NOW = (asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedFunctionError,
           asyncpg.QueryCanceledError)
RETRY_S = 1.0  # the table's ANALYZE or VACUUM lock was held: ask again after this


class TableStatistics:
    """When to ask for fresh statistics: after a full claim that followed a short one."""

    def __init__(self, min_interval_s: float = 5.0) -> None:
        self.min_interval_s = min_interval_s
        self._was_full = False
        self._due_rows = 0  # > 0: ask before the next claim, for this many rows
        self._asked_at = float("-inf")
        self._retry_at = float("-inf")
        self.refreshed = 0  # ANALYZEs this relay had run (tests, the log)

    def claimed(self, rows: int, full: bool) -> None:
        """After each claim of the drain (`rows` taken; `full`: the batch was full)."""
        if (full and not self._was_full
                and time.monotonic() - self._asked_at >= self.min_interval_s):
            self._due_rows = max(rows, 1)
        self._was_full = full

    async def refresh_if_due(self, conn: Any, q: Queries) -> None:
        """After a claim's batch, outside its transaction: ask for the refresh if one is due."""
        if not self._due_rows or time.monotonic() < self._retry_at:
            return
        rows, self._due_rows = self._due_rows, 0
        self._asked_at = time.monotonic()
        started = time.monotonic()
        try:
            analyzed = await conn.fetchval(q["refresh_statistics"], rows)
        except NOT_NOW as exc:
            # Not the claim's fault: claim with the statistics as they are.
            log.warning("table_statistics_refresh_failed", error=str(exc),
                        hint="relay migrate grants the relay role EXECUTE on the function "
                             "that analyzes the table")
            return
        if analyzed is None:  # busy: again after the first claim RETRY_S from now
            self._due_rows = rows
            self._retry_at = time.monotonic() + RETRY_S
        elif analyzed:
            self.refreshed += 1
            log.info("table_statistics_refreshed", rows_claimed=rows,
                     took_s=round(time.monotonic() - started, 3))
