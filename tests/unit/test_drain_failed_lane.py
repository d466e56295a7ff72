"""A drain whose lane failed on the database (relay/loop/worker.py): lanes still claiming are
cancelled at once, so the drain reports the failure without waiting for them; a lane that is
sending its batch finishes it (its rows may be acked already), and its rows are published.

On a silent server a lane still claiming waits out a command timeout or two (a pooled
connection's claim, a new connection's checks): the drain waited for it, and a relay noticed a
black-holed PostgreSQL after 70 s for a 35 s command timeout (tests/chaos/test_black_hole.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from relay.errors import DatabaseError
from relay.loop.worker import Worker, WorkerConfig
from tests.kit.fakes import FakeClaim, FakePublisher, FakeStore
from tests.unit.test_worker_wakeup import row


class SilentAfterFirst(FakeStore):
    """The first claim (the drain's single batch) is full; then one lane's claim fails after
    `fail_after_s`, and every other claim waits for an answer that never comes, or (`send`)
    gets rows and sends them through a publisher that is held."""

    fail_after_s = 0.1
    send = False
    hung: int = 0
    cancelled: int = 0

    @asynccontextmanager
    async def claim(self, limit: int, *, max_bytes: int | None = None
                    ) -> AsyncIterator[FakeClaim]:
        self.claims += 1
        if self.claims == 1 or (self.send and self.claims == 2):
            async with super().claim(limit, max_bytes=max_bytes) as batch:
                self.claims -= 1
                yield batch
                return
        if self.claims == 3 if self.send else self.claims == 2:
            await asyncio.sleep(self.fail_after_s)
            raise DatabaseError("claiming rows failed: TimeoutError()")
        self.hung += 1
        try:
            await asyncio.Event().wait()  # a statement on a dead connection
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        yield FakeClaim([], self)  # never reached


async def test_drain__a_failed_lane_cancels_the_lanes_still_claiming_and_reports_at_once() -> None:
    store = SilentAfterFirst(rows=[row(n) for n in range(1, 5)])
    worker = Worker(store, FakePublisher(), WorkerConfig(batch_size=2, concurrency=3))
    with pytest.raises(DatabaseError, match="claiming rows failed"):
        await asyncio.wait_for(worker.drain(), timeout=5)
    assert (store.hung, store.cancelled) == (2, 2), "the two other lanes' claims cancelled"


class HoldsTheSecondBatch(FakePublisher):
    """The second batch (a lane's) waits in publish until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.sending = asyncio.Event()

    async def publish(self, messages, *, deadline=None):  # type: ignore[no-untyped-def]
        if len(self.calls) == 1:
            self.sending.set()
            await self.release.wait()
        return await super().publish(messages, deadline=deadline)


async def test_drain__a_lane_sending_when_another_failed_finishes_its_batch() -> None:
    store = SilentAfterFirst(rows=[row(n) for n in range(1, 7)])
    store.send = True
    publisher = HoldsTheSecondBatch()
    worker = Worker(store, publisher, WorkerConfig(batch_size=2, concurrency=3))
    drain = asyncio.ensure_future(worker.drain())
    await asyncio.wait_for(publisher.sending.wait(), timeout=5)
    await asyncio.sleep(0.3)  # another lane failed meanwhile (after 0.1 s)
    assert not drain.done(), "the drain waits for the batch that is sending"
    publisher.release.set()
    with pytest.raises(DatabaseError, match="claiming rows failed"):
        await asyncio.wait_for(drain, timeout=5)
    sent = publisher.calls[1]
    assert len(sent) == 2
    assert set(sent) <= set(publisher.published), "its rows published"
    assert set(sent) <= set(store.deleted), "and settled"
    assert store.cancelled == store.hung == 1
