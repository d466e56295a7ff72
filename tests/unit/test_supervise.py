"""The supervision primitive: backoff, one log line per outage, stop-aware waits, give-up bound."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from relay.supervise import Backoff, GaveUp, Stopping, Supervisor, Supervisors

FAST = Backoff(base_s=0.001, max_s=0.004)


def test_backoff__doubles_up_to_the_cap_with_jitter() -> None:
    delays = Backoff(base_s=1.0, max_s=8.0).delays()
    seen = [next(delays) for _ in range(8)]
    for got, cap in zip(seen, [1, 2, 4, 8, 8, 8, 8, 8], strict=True):
        assert cap / 2 <= got <= cap


async def test_establish__retries_listed_errors_until_success_and_logs_one_outage() -> None:
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 5:
            raise ConnectionRefusedError("refused")
        return "conn"

    sup = Supervisor("db", backoff=FAST)
    with structlog.testing.capture_logs() as logs:
        assert await sup.establish(attempt, retry_on=(OSError,)) == "conn"
    assert calls == 5
    assert [e["event"] for e in logs] == ["connection_waiting", "connection_restored"]
    assert logs[1]["attempts"] == 5
    assert sup.up
    assert sup.snapshot()["state"] == "up"


async def test_lost__after_being_up_logs_connection_lost_once_per_outage() -> None:
    sup = Supervisor("broker", backoff=FAST)

    async def ok() -> int:
        return 1

    await sup.establish(ok)
    with structlog.testing.capture_logs() as logs:
        sup.lost(ConnectionResetError("reset"))
        sup.lost(ConnectionResetError("reset again"))
        assert sup.snapshot()["state"] == "down"
        await sup.establish(ok)
    assert [e["event"] for e in logs] == ["connection_lost", "connection_restored"]
    assert sup.outages == 1


async def test_establish__error_outside_retry_on_propagates_at_once() -> None:
    async def attempt() -> None:
        raise PermissionError("password authentication failed")

    sup = Supervisor("db", backoff=FAST)
    with pytest.raises(PermissionError):
        await sup.establish(attempt, retry_on=(ConnectionError,))


async def test_establish__gives_up_after_the_start_up_bound() -> None:
    async def attempt() -> None:
        raise ConnectionRefusedError("refused")

    sup = Supervisor("db", backoff=FAST, give_up_after_s=0.05, describe="127.0.0.1:1")
    with pytest.raises(GaveUp, match=r"db: 127\.0\.0\.1:1 unreachable"):
        await sup.establish(attempt)


async def test_establish__no_give_up_once_the_server_was_up() -> None:
    calls = 0

    async def attempt() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return 1
        if calls < 60:
            raise ConnectionRefusedError("refused")
        return 2

    sup = Supervisor("db", backoff=Backoff(0.001, 0.002), give_up_after_s=0.01)
    assert await sup.establish(attempt) == 1
    sup.lost("gone")
    assert await sup.establish(attempt) == 2


async def test_stop__ends_a_backoff_sleep_at_once() -> None:
    sups = Supervisors(backoff=Backoff(base_s=60, max_s=60))
    sup = sups.add("db")

    async def attempt() -> None:
        raise ConnectionRefusedError("refused")

    task = asyncio.ensure_future(sup.establish(attempt))
    await asyncio.sleep(0.05)
    sups.stop()
    with pytest.raises(Stopping):
        await asyncio.wait_for(task, timeout=1.0)
    assert sups.snapshot()["db"]["state"] == "stopped"
