"""The pure parts of the wake-up: the adaptive poll of `off` mode, the default mode."""

from __future__ import annotations

import asyncio

import pytest

from relay.pg.wakeup import AdaptivePoll, AlwaysNotified
from relay.settings import NotifyMode, Settings


def test_adaptive_poll__shortens_to_minimum_while_sweeps_find_rows() -> None:
    poll = AdaptivePoll(0.05, 5.0)
    assert [poll.next_s(found_rows=False) for _ in range(3)] == [0.1, 0.2, 0.4]
    assert poll.next_s(found_rows=True) == 0.05


def test_adaptive_poll__doubles_up_to_poll_interval_while_sweeps_find_nothing() -> None:
    poll = AdaptivePoll(0.05, 1.0)
    intervals = [poll.next_s(found_rows=False) for _ in range(10)]
    assert intervals[-1] == 1.0
    assert intervals == sorted(intervals)


async def test_always_notified_gate__never_asks_for_a_final_sweep_or_caps_the_sleep() -> None:
    gate = AlwaysNotified()
    plan = await gate.prepare_sleep(asyncio.Event(), found_rows=True)
    assert not plan.sweep
    assert not plan.due_known  # the worker reads the next due time itself
    assert gate.sleep_cap_s() is None


def test_settings__conditional_is_the_default_notify_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RELAY_NOTIFY", raising=False)
    assert Settings(_env_file=None).notify is NotifyMode.CONDITIONAL  # type: ignore[call-arg]
