"""The archiving relay's partition upkeep (relay/pg/archive.py), driven with a fake: hourly
while it works; after a failure (a reader held the archive) again at the retry pace, and back
to hourly once it works; the failures in a row are reported after each try (the relay's
relay_archive_upkeep_failures gauge)."""

from __future__ import annotations

import asyncio
import contextlib

from relay.errors import DatabaseError
from relay.pg.archive import PartitionKeeper
from tests.helpers import wait_until


async def test_partition_keeper__retries_soon_after_a_failure_then_hourly_again() -> None:
    outcomes: list[int | DatabaseError] = [DatabaseError("lock not available"),
                                           DatabaseError("lock not available"), 0, 0]
    calls: list[float] = []

    async def make_ahead() -> int:
        calls.append(asyncio.get_running_loop().time())
        outcome = outcomes.pop(0) if outcomes else 0
        if isinstance(outcome, DatabaseError):
            raise outcome
        return outcome

    reported: list[int] = []
    keeper = PartitionKeeper(make_ahead, every_s=3600.0, retry_s=0.01,
                             on_failures=reported.append)
    task = asyncio.ensure_future(keeper.run())
    try:
        await wait_until(lambda: len(calls) >= 3, timeout_s=5, what="two retries after failures")
        assert keeper.failures == 0
        await asyncio.sleep(0.1)
        assert len(calls) == 3, "hourly again once it worked"
        assert reported == [1, 2, 0], "failures in a row after each try (the metric)"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
