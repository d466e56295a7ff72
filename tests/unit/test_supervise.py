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


async def test_failed_ok__one_attempt_at_a_time_logs_one_outage_and_one_recovery() -> None:
    sup = Supervisor("database", backoff=FAST)
    sup.ok()
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            sup.failed(ConnectionResetError("reset"))
            assert await sup.pause()
        assert not sup.up
        sup.ok()
        sup.ok()
    assert [e["event"] for e in logs] == ["connection_lost", "connection_restored"]
    assert logs[1]["attempts"] == 4
    assert sup.snapshot()["outages"] == 1


async def test_pause__backoff_grows_within_an_outage_and_restarts_after_recovery() -> None:
    sup = Supervisor("database", backoff=Backoff(base_s=1.0, max_s=8.0))
    asked: list[float] = []

    async def record(seconds: float) -> bool:
        asked.append(seconds)
        return True

    sup._sleep_unless_woken = record  # type: ignore[method-assign]
    sup.failed("down")
    for _ in range(4):
        await sup.pause()
    sup.ok()
    sup.failed("down again")
    await sup.pause()
    for got, cap in zip(asked, [1, 2, 4, 8, 1], strict=True):
        assert cap / 2 <= got <= cap


async def test_failed__raises_gave_up_past_the_start_up_bound_only_before_first_success() -> None:
    sup = Supervisor("broker", backoff=FAST, give_up_after_s=0.02)
    sup.failed("refused")
    await asyncio.sleep(0.03)
    with pytest.raises(GaveUp):
        sup.failed("refused")
    up_once = Supervisor("broker", backoff=FAST, give_up_after_s=0.02)
    up_once.ok()
    up_once.failed("refused")
    await asyncio.sleep(0.03)
    up_once.failed("refused")  # a server lost after it was up is retried for ever
    assert up_once.snapshot()["state"] == "down"


async def test_supervisors__only_bounded_ones_give_up_and_snapshot_names_each() -> None:
    sups = Supervisors(backoff=FAST, give_up_after_s=0.01)
    bounded = sups.add("database", bounded=True)
    unbounded = sups.add("listener")
    assert bounded.give_up_after_s == 0.01
    assert unbounded.give_up_after_s is None
    sups.discard("listener")
    assert set(sups.snapshot()) == {"database"}


@pytest.mark.parametrize("cut", [StopAsyncIteration(), EOFError("eof"),
                                 asyncio.IncompleteReadError(b"", 1)])
async def test_broker_connect__a_handshake_cut_is_unreachable_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, cut: BaseException
) -> None:
    """aiormq's frame reader can end a handshake that a front resets with StopAsyncIteration:
    it escaped the retry and `relay run` exited 1 with a raw traceback."""
    from relay.amqp import connection as conn_module

    async def connect(*_: object, **__: object) -> object:
        raise cut

    monkeypatch.setattr(conn_module.aio_pika, "connect", connect)
    broker = conn_module.BrokerConnection("amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(conn_module.BrokerUnreachable):
        await broker._attempt()


def test_supervisor__logs_the_outage_once_and_each_new_kind_of_cause_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sup = Supervisor("broker")
    sup.ok()
    sup.lost("connection closed")
    for _ in range(5):
        sup.failed(ValueError("refused"))
        sup.failed(KeyError("other"))
    out = capsys.readouterr().out
    assert out.count("connection_lost") == 1
    assert out.count("connection_failing") == 2


async def test_wake__ends_the_pause_of_an_outage_at_once_and_only_that_pause() -> None:
    """Another session to the same server came back: the connection tries again now rather
    than after a backoff delay that may have grown to half a minute."""
    sup = Supervisor("database", backoff=Backoff(base_s=60, max_s=60))
    sup.failed("down")
    loop = asyncio.get_running_loop()
    paused = asyncio.ensure_future(sup.pause())
    await asyncio.sleep(0.05)
    assert not paused.done()
    started = loop.time()
    sup.wake()
    assert await asyncio.wait_for(paused, timeout=1.0) is True
    assert loop.time() - started < 0.5
    # The wake was used up: the next pause of the same outage waits its delay again.
    again = asyncio.ensure_future(sup.pause())
    await asyncio.sleep(0.05)
    assert not again.done()
    sup.stop()
    assert await asyncio.wait_for(again, timeout=1.0) is False


async def test_wake__while_up_is_forgotten_and_does_not_shorten_a_later_outage() -> None:
    sup = Supervisor("database", backoff=Backoff(base_s=60, max_s=60))
    sup.ok()
    sup.wake()
    sup.failed("down")
    paused = asyncio.ensure_future(sup.pause())
    await asyncio.sleep(0.05)
    assert not paused.done()
    sup.stop()
    assert await asyncio.wait_for(paused, timeout=1.0) is False
