"""Steady load: rows committed while a batch is in flight are claimed right after it, by one
claim (relay/loop/worker.py `drain`, `_lane`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from relay.interfaces import Message, OutboxRow, PublishResult
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until
from tests.kit.fakes import FakePublisher, FakeStore, rows


class SlowFirstPublisher:
    """Holds the first batch until released, as a broker confirm would."""

    ready = True

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.in_flight = asyncio.Event()
        self.batches: list[list[str]] = []

    async def wait_ready(self) -> None:
        return None

    def build(self, row: OutboxRow) -> object:
        return FakePublisher().build(row)

    async def publish(
        self, messages: Sequence[Message], *, deadline: float | None = None
    ) -> PublishResult:
        self.batches.append([m.id for m in messages])
        if len(self.batches) == 1:
            self.in_flight.set()
            await self.release.wait()
        return PublishResult(confirmed=[m.id for m in messages])


async def test_lane__claims_rows_committed_during_its_batch_when_woken() -> None:
    store, pub = FakeStore(rows(3)), SlowFirstPublisher()
    worker = Worker(store, pub, WorkerConfig(batch_size=10, concurrency=3, poll_interval_s=30))
    run = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait_for(pub.in_flight.wait(), timeout=5)
        store.rows += [r._replace(id=f"late-{r.id}") for r in rows(2)]  # a producer commits
        worker.wake()  # ... and its NOTIFY arrives while the first batch awaits its confirms
        pub.release.set()
        await wait_until(lambda: not store.rows, timeout_s=5, what="the late rows settled")
    finally:
        worker.stop()
        await asyncio.wait_for(run, timeout=5)
    assert len(pub.batches) == 2
    assert pub.batches[1] == ["late-id-0", "late-id-1"]
    # One claim per batch: the NOTIFY brought one more sweep, not a claim on every lane.
    assert store.claims == 3  # the two batches, then the claim that found nothing


async def test_lane__without_a_wake_up_a_short_batch_ends_the_drain() -> None:
    store, pub = FakeStore(rows(3)), SlowFirstPublisher()
    pub.release.set()
    worker = Worker(store, pub, WorkerConfig(batch_size=10, concurrency=1, poll_interval_s=30))
    await asyncio.wait_for(worker.drain(), timeout=5)
    assert len(pub.batches) == 1
    assert store.claims == 1
