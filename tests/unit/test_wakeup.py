"""The pure parts of the wake-up: the adaptive poll of `off` mode, the default mode, the lock
session's backoff."""

from __future__ import annotations

import asyncio

import pytest

from relay.loop.sleep import AdaptivePoll
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


def test_settings__conditional_is_the_default_notify_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RELAY_NOTIFY", raising=False)
    assert Settings(_env_file=None).notify is NotifyMode.CONDITIONAL  # type: ignore[call-arg]


async def test_lock_session__a_failing_wakeup_path_backs_off_instead_of_reconnecting_in_a_loop(
) -> None:
    """A statement that fails in the wake-up path (it once did for available_at = infinity)
    dropped the session and reconnected at once, about 1,500 transactions a second."""
    from relay.errors import DatabaseUnavailable
    from relay.pg.queries import Queries, TableNames
    from relay.pg.wakeup import WakeupLockSession

    attempts = 0

    async def connect() -> object:
        nonlocal attempts
        attempts += 1
        raise DatabaseUnavailable("refused")

    lock = WakeupLockSession(
        connect, Queries(TableNames("public", "queue_message", "queue_message_notify")),  # type: ignore[arg-type]
        lambda: None)
    loop = asyncio.get_running_loop()
    until = loop.time() + 1.0
    while loop.time() < until:
        await lock.prepare(asyncio.Event(), queue=True)
        await asyncio.sleep(0.001)
    # Delays of 0.1-0.2 s, then doubling: a handful of attempts in a second, not hundreds.
    assert 1 <= attempts <= 6, attempts
