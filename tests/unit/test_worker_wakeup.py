"""The worker's side of the wake-up gate, driven with fakes: the final sweep before sleeping,
and the sleep caps the gate sets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from relay.interfaces import Message, OutboxRow, PublishResult, Settlement
from relay.loop.wakeup_policy import BUSY_DRAIN_ROWS
from relay.loop.worker import Worker, WorkerConfig
from relay.pg.wakeup import SleepPlan
from tests.helpers import wait_until


@dataclass
class FakeBatch:
    rows: Sequence[OutboxRow]

    async def settle(self, settlement: Settlement) -> None:
        pass


@dataclass
class FakeStore:
    """Rows committed by producers; claim() takes them all."""

    rows: list[OutboxRow] = field(default_factory=list)
    claims: int = 0

    @asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[FakeBatch]:
        self.claims += 1
        taken, self.rows = self.rows[:limit], self.rows[limit:]
        yield FakeBatch(taken)

    async def seconds_until_next_due(self) -> float | None:
        return None


@dataclass
class FakePublisher:
    published: list[str] = field(default_factory=list)
    ready: bool = True

    async def wait_ready(self) -> None:
        pass

    async def publish(self, messages: Sequence[Message]) -> PublishResult:
        self.published += [m.id for m in messages]
        return PublishResult(confirmed=[m.id for m in messages])


def row(n: int) -> OutboxRow:
    return OutboxRow(f"id-{n}", "x", "rk", "{}", None, 0)


@dataclass
class LateProducerGate:
    """Like the lock gate when a producer that skipped the NOTIFY commits just before the
    lock is granted: its row appears during prepare_sleep, and no NOTIFY will come."""

    store: FakeStore
    cap_s: float | None = None
    calls: list[tuple[str, bool]] = field(default_factory=list)

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> SleepPlan:
        self.calls.append(("prepare_sleep", found_rows))
        if [name for name, _ in self.calls].count("prepare_sleep") == 1:
            self.store.rows.append(row(1))
            return SleepPlan(stay_awake=True, due_known=True)
        return SleepPlan(due_known=True)

    async def mark_awake(self) -> None:
        self.calls.append(("mark_awake", False))

    def sleep_cap_s(self) -> float | None:
        return self.cap_s

    async def close(self) -> None:
        pass


async def test_worker__final_sweep_after_gate_registers_sleep_finds_late_rows() -> None:
    store, publisher = FakeStore(), FakePublisher()
    gate = LateProducerGate(store)
    worker = Worker(store, publisher, WorkerConfig(poll_interval_s=60, concurrency=1), gate=gate)
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(lambda: publisher.published == ["id-1"], timeout_s=5,
                         what="the late row published before the 60 s poll")
    finally:
        worker.stop()
        await task
    assert publisher.published == ["id-1"]
    assert store.claims >= 2  # the start-up sweep, then the final one


async def test_worker__sleep_cap_from_gate_shortens_the_poll_and_reports_found_rows() -> None:
    store, publisher = FakeStore(rows=[row(1)]), FakePublisher()
    gate = LateProducerGate(store, cap_s=0.01)
    gate.calls.append(("prepare_sleep", False))  # no late producer in this test
    worker = Worker(store, publisher, WorkerConfig(poll_interval_s=60, concurrency=1), gate=gate)
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(lambda: store.claims >= 5, timeout_s=5, what="sweeps every 10 ms")
    finally:
        worker.stop()
        await task
    found = [f for name, f in gate.calls if name == "prepare_sleep"][1:]
    assert found[0] is True  # the start-up sweep found the row
    assert not any(found[1:])
    assert ("mark_awake", False) in gate.calls


@dataclass
class CountingStore(FakeStore):
    due_queries: int = 0

    async def seconds_until_next_due(self) -> float | None:
        self.due_queries += 1
        return None


@dataclass
class RecordingGate:
    """Answers every prepare_sleep with `plans` in turn (then the last one), recording the
    order of calls against the store's claims."""

    store: FakeStore
    plans: list[SleepPlan]
    cap_s: float | None = 0.01
    events: list[str] = field(default_factory=list)

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> SleepPlan:
        self.events.append(f"prepare_sleep found={found_rows} claims={self.store.claims}")
        return self.plans.pop(0) if len(self.plans) > 1 else self.plans[0]

    async def mark_awake(self) -> None:
        self.events.append(f"mark_awake claims={self.store.claims}")

    def sleep_cap_s(self) -> float | None:
        return self.cap_s

    async def close(self) -> None:
        pass


async def _run_until(worker: Worker, predicate: Callable[[], bool], what: str) -> None:
    task = asyncio.ensure_future(worker.run())
    try:
        await wait_until(predicate, timeout_s=5, what=what)
    finally:
        worker.stop()
        await task


async def test_worker__busy_drain_sweeps_again_before_asking_the_gate_to_sleep() -> None:
    store = FakeStore(rows=[row(n) for n in range(BUSY_DRAIN_ROWS)])
    gate = RecordingGate(store, [SleepPlan(due_known=True)])
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    gate=gate)
    await _run_until(worker, lambda: bool(gate.events), "a sleep")
    # The start-up sweep brought a busy drain's worth: a second sweep came before any sleep.
    assert gate.events[0].startswith("mark_awake")
    first_sleep = next(e for e in gate.events if e.startswith("prepare_sleep"))
    assert first_sleep == "prepare_sleep found=False claims=2"


async def test_worker__gate_that_read_the_due_time_spares_the_store_its_query() -> None:
    store = CountingStore()
    gate = RecordingGate(store, [SleepPlan(due_known=True, next_due_s=None)])
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    gate=gate)
    await _run_until(worker, lambda: store.claims >= 5, "sleeps capped at 10 ms")
    assert store.due_queries == 0
    # Without the gate's reading the worker asks the store.
    store2 = CountingStore()
    worker2 = Worker(store2, FakePublisher(),
                     WorkerConfig(poll_interval_s=0.01, concurrency=1))
    await _run_until(worker2, lambda: store2.claims >= 3, "polls")
    assert store2.due_queries >= 2


async def test_worker__rows_due_at_the_check_are_drained_awake_then_checked_again() -> None:
    store = FakeStore()
    gate = RecordingGate(store, [SleepPlan(stay_awake=True, due_known=True),
                                 SleepPlan(due_known=True)], cap_s=None)
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    gate=gate)
    await _run_until(worker, lambda: len(gate.events) >= 4, "a second check")
    # start-up sweep (claim 1); check: rows due -> lock released, then a sweep (claim 2), then
    # the gate is asked again before any sleep.
    assert gate.events[:4] == ["mark_awake claims=0", "prepare_sleep found=False claims=1",
                               "mark_awake claims=1", "prepare_sleep found=False claims=2"]
