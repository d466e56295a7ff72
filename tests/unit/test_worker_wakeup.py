"""The worker's sleep against the wake-up lock, driven with fakes: the final sweep before
sleeping, and the sleep caps that follow from what the lock reports (relay/loop/sleep.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from relay.interfaces import LockState, OutboxRow
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until
from tests.kit.fakes import FakeLock, FakePublisher, FakeStore

HELD_NOTHING_DUE = LockState(role="sleeper", mode="conditional", held=True, checked=True)
HELD_ROWS_DUE = LockState(role="sleeper", mode="conditional", held=True, checked=True,
                          due_now=True)


def row(n: int) -> OutboxRow:
    return OutboxRow(f"id-{n}", "x", "rk", "{}", None, 0)


@dataclass
class LateProducerLock(FakeLock):
    """Like the lock session when a producer that skipped the NOTIFY commits just before the
    lock is granted: its row appears during prepare, and no NOTIFY will come."""

    store: FakeStore = field(default_factory=FakeStore)
    calls: list[tuple[str, bool]] = field(default_factory=list)

    async def prepare(self, woken: asyncio.Event, *, queue: bool) -> LockState:
        self.calls.append(("prepare", not queue))  # tried only: the last drain found rows
        if [name for name, _ in self.calls].count("prepare") == 1:
            self.store.rows.append(row(1))
            return HELD_ROWS_DUE
        return HELD_NOTHING_DUE

    async def release(self) -> None:
        self.calls.append(("release", False))


async def test_worker__final_sweep_after_the_lock_is_held_finds_late_rows() -> None:
    store, publisher = FakeStore(), FakePublisher()
    lock = LateProducerLock(store=store)
    worker = Worker(store, publisher, WorkerConfig(poll_interval_s=60, concurrency=1), lock=lock)
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(lambda: publisher.published == ["id-1"], timeout_s=5,
                         what="the late row published before the 60 s poll")
    finally:
        worker.stop()
        await task
    assert publisher.published == ["id-1"]
    assert store.claims >= 2  # the start-up sweep, then the final one


async def test_worker__no_lock_session_polls_at_the_fallback_and_a_drain_with_rows_only_tries(
) -> None:
    store, publisher = FakeStore(rows=[row(1)]), FakePublisher()
    lock = LateProducerLock(store=store)
    lock.calls.append(("prepare", False))  # no late producer in this test
    # The lock's session is away (mode unknown): the sleeper polls at the fallback interval.
    lock.current = LockState()
    worker = Worker(store, publisher, WorkerConfig(poll_interval_s=60, concurrency=1,
                                                   fallback_poll_s=0.01), lock=lock)
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(lambda: store.claims >= 5, timeout_s=5, what="sweeps every 10 ms")
    finally:
        worker.stop()
        await task
    # With the mode unknown every request queues; the rule of trying only applies once the
    # sleeper knows the table is in conditional mode.
    assert not any(tried for name, tried in lock.calls[1:] if name == "prepare")
    assert ("release", False) in lock.calls


async def test_worker__after_a_drain_that_found_rows_the_sleeper_only_tries_the_lock() -> None:
    store, publisher = FakeStore(rows=[row(1)]), FakePublisher()
    lock = LateProducerLock(store=store)
    lock.calls.append(("prepare", False))
    worker = Worker(store, publisher, WorkerConfig(poll_interval_s=0.05, concurrency=1),
                    lock=lock)
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(lambda: len(lock.calls) >= 4, timeout_s=5, what="two sleeps")
    finally:
        worker.stop()
        await task
    tried = [t for name, t in lock.calls[1:] if name == "prepare"]
    assert tried[0] is True  # the start-up sweep found the row: try, do not queue
    assert not any(tried[1:])
