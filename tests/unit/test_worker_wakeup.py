"""The worker's side of the wake-up gate, driven with fakes: the final sweep before sleeping,
and the sleep caps the gate sets."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from relay.interfaces import OutboxRow
from relay.loop.sleep import SleepPlan
from relay.loop.worker import Worker, WorkerConfig
from tests.helpers import wait_until
from tests.unit.kit import FakeGate, FakePublisher, FakeStore


def row(n: int) -> OutboxRow:
    return OutboxRow(f"id-{n}", "x", "rk", "{}", None, 0)


@dataclass
class LateProducerGate(FakeGate):
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

