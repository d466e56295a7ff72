"""The partitioned archive's days (docs/operations.md, "Retention"): once `relay migrate
--partition-archive` has partitioned it by day, its partitions for the coming days are made
ahead, by `relay migrate` and every hour by each archiving relay, so that a row is archived into
its day's partition, not the DEFAULT one. On an archive that is not partitioned this does
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from relay.errors import DatabaseError
from relay.pg.connection import DB_ERRORS
from relay.pg.queries import Queries

log = structlog.get_logger(__name__)

# Partitions exist from today through this many days ahead: a relay that cannot reach the
# database for a week still finds its day's partition.
ARCHIVE_DAYS_AHEAD = 7
KEEP_EVERY_S = 3600.0
# After a failure (a reader holds the archive: each CREATE waits at most 100 ms for its lock,
# sql/migrations/0026), the next try comes this soon.
RETRY_AFTER_S = 60.0


async def partitions_ahead(conn: Any, q: Queries) -> int:
    """Create the missing daily partitions from today through ARCHIVE_DAYS_AHEAD days ahead;
    how many. `conn`: a connection or a pool."""
    try:
        return int(await conn.fetchval(q["archive_partitions_ahead"], ARCHIVE_DAYS_AHEAD))
    except DB_ERRORS as exc:
        raise DatabaseError(f"creating the archive's partitions failed: {exc!r}") from exc


class PartitionKeeper:
    """An archiving relay's service: partitions ahead now and every `every_s`; a failure (a
    reader holding the archive, whose lock the CREATE waits for only 100 ms) is logged, counted
    in `on_failures` (failures in a row, 0 after a success) and tried again after `retry_s`
    (the DEFAULT partition catches rows meanwhile)."""

    def __init__(self, make_ahead: Callable[[], Awaitable[int]],
                 every_s: float = KEEP_EVERY_S, retry_s: float = RETRY_AFTER_S, *,
                 on_failures: Callable[[int], None] | None = None) -> None:
        self._make_ahead = make_ahead
        self._every_s = every_s
        self._retry_s = min(retry_s, every_s)
        self._on_failures = on_failures  # failures in a row, after each try (a metric)
        self.failures = 0  # in a row

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            try:
                made = await self._make_ahead()
                if made:
                    log.info("archive_partitions_made", count=made)
                self.failures = 0
            except DatabaseError as exc:
                self.failures += 1
                log.warning("archive_partitions_failed", error=str(exc), failures=self.failures,
                            retry_s=self._retry_s)
            if self._on_failures is not None:
                self._on_failures(self.failures)
            await asyncio.sleep(self._retry_s if self.failures else self._every_s)

    async def close(self) -> None:
        """Nothing to close: it borrows the store's pool."""
