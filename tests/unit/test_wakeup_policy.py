"""The sleep policy, driven with fakes: a busy drain sweeps again before sleeping; rows due
at the gate's check are drained awake and checked again; the store's due-time query runs only
when the gate did not read the due time (relay/pg/wakeup.py, docs/notify.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.loop.sleep import BUSY_DRAIN_ROWS, FLOW_GAP_S, SleepPlan
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until
from tests.unit.kit import FakeGate, FakePublisher, FakeStore
from tests.unit.test_worker_wakeup import row


@dataclass
class CountingStore(FakeStore):
    due_queries: int = 0

    async def seconds_until_next_due(self) -> float | None:
        self.due_queries += 1
        return None


@dataclass
class RecordingGate(FakeGate):
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


@dataclass
class CommitDuringSleepGate(RecordingGate):
    """At the first prepare_sleep, a producer commits a row `after_s` later and notifies."""

    after_s: float = 0.0
    committed: bool = False

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> SleepPlan:
        plan = await super().prepare_sleep(woken, found_rows)
        if not self.committed:
            self.committed = True
            await asyncio.sleep(self.after_s)
            self.store.rows.append(row(99))
            woken.set()
        return plan


async def test_worker__a_wakeup_soon_after_the_last_sweep_that_found_rows_sweeps_again() -> None:
    store = FakeStore(rows=[row(1)])
    gate = CommitDuringSleepGate(store, [SleepPlan(due_known=True)], cap_s=None)
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    gate=gate)
    await _run_until(worker, lambda: len(gate.events) >= 5, "the second prepare_sleep")
    # start-up sweep (claim 1, one row) -> sleep -> a row commits at once -> its sweep (claim
    # 2) came within the flow gap and found a row: a sweep again (claim 3, empty) before the
    # gate is asked to sleep.
    assert gate.events[:5] == ["mark_awake claims=0", "prepare_sleep found=True claims=1",
                               "mark_awake claims=1", "mark_awake claims=2",
                               "prepare_sleep found=False claims=3"]


async def test_worker__a_row_at_a_trickle_goes_to_the_sleep_check_at_once() -> None:
    store = FakeStore(rows=[row(1)])
    gate = CommitDuringSleepGate(store, [SleepPlan(due_known=True)], cap_s=None,
                                 after_s=FLOW_GAP_S * 4)
    worker = Worker(store, FakePublisher(), WorkerConfig(poll_interval_s=60, concurrency=1),
                    gate=gate)
    await _run_until(worker, lambda: len(gate.events) >= 4, "the second prepare_sleep")
    # The row came long after the last sweep: its sweep is followed by the sleep check.
    assert gate.events[:4] == ["mark_awake claims=0", "prepare_sleep found=True claims=1",
                               "mark_awake claims=1", "prepare_sleep found=True claims=2"]
