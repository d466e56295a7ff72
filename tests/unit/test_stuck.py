"""Where a stuck task waits (relay/ops/stuck.py): the chain of awaits down to the innermost
call, which the log line of a stop that timed out carries."""

from __future__ import annotations

import asyncio

from relay.ops.stuck import waiting_tasks


async def _statement(gate: asyncio.Event) -> None:
    await gate.wait()


async def _settle(gate: asyncio.Event) -> None:
    await _statement(gate)


async def _batch(gate: asyncio.Event) -> None:
    await _settle(gate)


async def test_a_waiting_task_reads_down_to_the_call_that_waits() -> None:
    gate = asyncio.Event()
    task = asyncio.ensure_future(_batch(gate))
    task.set_name("worker")
    await asyncio.sleep(0)
    try:
        (entry,) = [t for t in waiting_tasks() if t["task"] == "worker"]
        names = [frame.split()[-1] for frame in entry["awaits"]]
        assert names[:3] == ["_batch", "_settle", "_statement"], entry
        assert all(frame.startswith("test_stuck.py:") for frame in entry["awaits"][:3])
        assert names[-1] == "wait"  # asyncio's Event.wait, the innermost await
    finally:
        gate.set()
        await task
    assert not [t for t in waiting_tasks() if t["task"] == "worker"]


async def test_the_calling_task_and_finished_tasks_are_left_out() -> None:
    done = asyncio.ensure_future(asyncio.sleep(0))
    await done
    me = asyncio.current_task()
    assert me is not None
    assert me.get_name() not in {t["task"] for t in waiting_tasks()}
