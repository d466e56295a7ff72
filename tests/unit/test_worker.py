"""The worker loop driven with fakes: draining, stopping, broker loss. No servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from relay.interfaces import Message, OutboxRow, PublishResult, Settlement
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until


@dataclass
class FakeBatch:
    rows: Sequence[OutboxRow]
    store: FakeStore

    async def settle(self, settlement: Settlement) -> None:
        self.store.settlements.append(settlement)
        gone = set(settlement.published) | {d[0] for d in settlement.dead}
        self.store.rows = [r for r in self.store.rows if r.id not in gone]


@dataclass
class FakeStore:
    rows: list[OutboxRow] = field(default_factory=list)
    settlements: list[Settlement] = field(default_factory=list)
    locked: set[str] = field(default_factory=set)
    claims: int = 0

    @asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[FakeBatch]:
        self.claims += 1
        free = [r for r in self.rows if r.id not in self.locked][:limit]
        self.locked |= {r.id for r in free}
        try:
            yield FakeBatch(free, self)
        finally:
            self.locked -= {r.id for r in free}

    async def seconds_until_next_due(self) -> float | None:
        return None


@dataclass
class FakePublisher:
    ready: bool = True
    lose_broker_once: bool = False
    published: list[str] = field(default_factory=list)

    async def wait_ready(self) -> None:
        self.ready = True

    async def publish(self, messages: Sequence[Message]) -> PublishResult:
        await asyncio.sleep(0)
        if self.lose_broker_once:
            self.lose_broker_once = False
            self.ready = False
            return PublishResult(unsent=[m.id for m in messages], broker_lost=True)
        self.published.extend(m.id for m in messages)
        return PublishResult(confirmed=[m.id for m in messages])


def rows(n: int) -> list[OutboxRow]:
    return [OutboxRow(f"id-{i}", "x", "rk", "{}", None, 0) for i in range(n)]


CONFIG = WorkerConfig(batch_size=10, concurrency=3, poll_interval_s=30)


async def test_drain__keeps_claiming_until_the_backlog_is_empty() -> None:
    store, pub = FakeStore(rows(95)), FakePublisher()
    await Worker(store, pub, CONFIG).drain()
    assert store.rows == []
    assert sorted(pub.published) == sorted(r.id for r in rows(95))


async def test_run__sweeps_at_start_and_stops_when_asked_twice() -> None:
    store, pub = FakeStore(rows(5)), FakePublisher()
    worker = Worker(store, pub, CONFIG)
    task = asyncio.ensure_future(worker.run())
    await wait_until(lambda: not store.rows, timeout_s=5, what="an empty store")
    worker.stop()
    worker.stop()
    await asyncio.wait_for(task, timeout=5)
    assert len(pub.published) == 5


async def test_run__a_wake_up_drains_rows_that_arrived_while_asleep() -> None:
    store, pub = FakeStore(), FakePublisher()
    worker = Worker(store, pub, CONFIG)
    task = asyncio.ensure_future(worker.run())
    await asyncio.sleep(0.05)
    store.rows = rows(3)
    worker.wake()
    for _ in range(200):
        if not store.rows:
            break
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, timeout=5)
    assert len(pub.published) == 3


async def test_broker_loss__unsent_rows_stay_and_are_published_after_reconnect() -> None:
    store, pub = FakeStore(rows(4)), FakePublisher(lose_broker_once=True)
    worker = Worker(store, pub, CONFIG)
    task = asyncio.ensure_future(worker.run())
    for _ in range(300):
        if not store.rows:
            break
        await asyncio.sleep(0.01)
    worker.stop()
    await asyncio.wait_for(task, timeout=5)
    assert sorted(pub.published) == sorted(r.id for r in rows(4))
    # the lost batch was settled with nothing: no attempts counted, nothing dead
    assert all(not s.retry and not s.dead for s in store.settlements)
