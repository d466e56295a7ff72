"""The sleep policy (relay/loop/sleep.py), driven with fakes: a busy drain sweeps again before
sleeping; rows due at the lock's check are drained awake and checked again; the store's
due-time query runs only when the lock did not read the due time (docs/notify.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.interfaces import LockState
from relay.loop.sleep import BUSY_DRAIN_ROWS, FLOW_GAP_S
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until
from tests.kit.fakes import FakeLock, FakePublisher, FakeStore
from tests.unit.test_worker_wakeup import HELD_NOTHING_DUE, HELD_ROWS_DUE, row


@dataclass
class CountingStore(FakeStore):
    due_queries: int = 0

    async def seconds_until_next_due(self) -> float | None:
        self.due_queries += 1
        return None


@dataclass
class RecordingLock(FakeLock):
    """Answers every prepare with `states` in turn (then the last one), recording the order of
    calls against the store's claims (found=True: the last drain found rows, so the sleeper
    only tried the lock)."""

    store: FakeStore = field(default_factory=FakeStore)
    states: list[LockState] = field(default_factory=lambda: [HELD_NOTHING_DUE])
    events: list[str] = field(default_factory=list)

    async def prepare(self, woken: asyncio.Event, *, queue: bool) -> LockState:
        self.events.append(f"prepare found={not queue} claims={self.store.claims}")
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    async def release(self) -> None:
        self.events.append(f"release claims={self.store.claims}")


def _polling(lock: RecordingLock) -> RecordingLock:
    """The lock's session is away: the sleeper polls at the fallback interval (10 ms here)."""
    lock.current = LockState()
    return lock


FAST_FALLBACK = {"fallback_poll_s": 0.01}


async def _run_until(worker: Worker, predicate: Callable[[], bool], what: str) -> None:
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(predicate, timeout_s=5, what=what)
    finally:
        worker.stop()
        await task


async def test_worker__busy_drain_sweeps_again_before_asking_the_lock() -> None:
    store = FakeStore(rows=[row(n) for n in range(BUSY_DRAIN_ROWS)])
    lock = RecordingLock(store=store)
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    lock=lock)
    await _run_until(worker, lambda: any(e.startswith("prepare") for e in lock.events),
                     "a sleep")
    # The start-up sweep brought a busy drain's worth: a second sweep came before any sleep.
    assert lock.events[0].startswith("release")
    first_sleep = next(e for e in lock.events if e.startswith("prepare"))
    assert first_sleep == "prepare found=False claims=2"


async def test_worker__lock_that_read_the_due_time_spares_the_store_its_query() -> None:
    store = CountingStore()
    lock = _polling(RecordingLock(store=store))
    worker = Worker(store, FakePublisher(),
                    WorkerConfig(poll_interval_s=60, concurrency=1, **FAST_FALLBACK), lock=lock)
    await _run_until(worker, lambda: store.claims >= 5, "sleeps capped at 10 ms")
    assert store.due_queries == 0
    # Without the lock's reading the worker asks the store.
    store2 = CountingStore()
    worker2 = Worker(store2, FakePublisher(),
                     WorkerConfig(poll_interval_s=0.01, concurrency=1))
    await _run_until(worker2, lambda: store2.claims >= 3, "polls")
    assert store2.due_queries >= 2


async def test_worker__rows_due_at_the_check_are_drained_awake_then_checked_again() -> None:
    store = FakeStore()
    lock = RecordingLock(store=store, states=[HELD_ROWS_DUE, HELD_NOTHING_DUE])
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    lock=lock)
    await _run_until(worker, lambda: len(lock.events) >= 4, "a second check")
    # start-up sweep (claim 1); check: rows due -> lock released, then a sweep (claim 2), then
    # the lock is asked again before any sleep.
    assert lock.events[:4] == ["release claims=0", "prepare found=False claims=1",
                               "release claims=1", "prepare found=False claims=2"]


@dataclass
class CommitDuringSleepLock(RecordingLock):
    """At the first prepare, a producer commits a row `after_s` later and notifies."""

    after_s: float = 0.0
    committed: bool = False

    async def prepare(self, woken: asyncio.Event, *, queue: bool) -> LockState:
        plan = await super().prepare(woken, queue=queue)
        if not self.committed:
            self.committed = True
            await asyncio.sleep(self.after_s)
            self.store.rows.append(row(99))
            woken.set()
        return plan


async def test_worker__a_wakeup_soon_after_the_last_sweep_that_found_rows_sweeps_again() -> None:
    store = FakeStore(rows=[row(1)])
    lock = CommitDuringSleepLock(store=store)
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    lock=lock)
    await _run_until(worker, lambda: len(lock.events) >= 5, "the second prepare")
    # start-up sweep (claim 1, one row) -> sleep -> a row commits at once -> its sweep (claim
    # 2) came within the flow gap and found a row: a sweep again (claim 3, empty) before the
    # lock is asked again.
    assert lock.events[:5] == ["release claims=0", "prepare found=True claims=1",
                               "release claims=1", "release claims=2",
                               "prepare found=False claims=3"]


async def test_worker__a_row_at_a_trickle_goes_to_the_sleep_check_at_once() -> None:
    store = FakeStore(rows=[row(1)])
    lock = CommitDuringSleepLock(store=store, after_s=FLOW_GAP_S * 4)
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    lock=lock)
    await _run_until(worker, lambda: len(lock.events) >= 4, "the second prepare")
    # The row came long after the last sweep: its sweep is followed by the sleep check.
    assert lock.events[:4] == ["release claims=0", "prepare found=True claims=1",
                               "release claims=1", "prepare found=True claims=2"]


@dataclass
class BrokenOnceLock(RecordingLock):
    """Its first prepare raises what a bug in the wake-up path would raise, after a row was
    written (with no NOTIFY: nothing else wakes the worker)."""

    raised: int = 0

    async def prepare(self, woken: asyncio.Event, *, queue: bool) -> LockState:
        if not self.raised:
            self.raised += 1
            self.store.rows.append(row(1))
            raise AttributeError("'NoneType' object has no attribute 'done'")
        return await super().prepare(woken, queue=queue)


async def test_worker__an_unexpected_error_in_the_sleep_is_logged_and_the_worker_goes_on(
) -> None:
    """A bug in the wake-up path once ended the worker task, and with it the relay; now the
    worker polls once at the fallback interval and sweeps: a row written meanwhile goes."""
    store = FakeStore()
    publisher = FakePublisher()
    lock = BrokenOnceLock(store=store)
    worker = Worker(store, publisher, WorkerConfig(poll_interval_s=60, concurrency=1,
                                                   **FAST_FALLBACK), lock=lock)
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(lambda: publisher.published == [row(1).id], timeout_s=5,
                         what="the row written during the failing sleep to be published")
        assert lock.raised == 1
        assert not task.done()
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=5)
