"""One sleeper per table (relay/pg/wakeup.py): with two relays in conditional mode, one holds
the sleeper role and the wake-up lock, the other waits for the role; killing the sleeper hands
the role over, and a row committed while no relay held the lock is delivered by the new
sleeper's check, not by the periodic sweep. Real PostgreSQL, RabbitMQ and `relay run`."""

from __future__ import annotations

import asyncio
import time

import pytest

from relay.pg.migrate import migrate
from relay.pg.queries import WAKEUP_LOCK_CLASS, Queries, TableNames
from relay.settings import NotifyMode
from tests.helpers import Env, pg_fetch, pg_fetchval, pg_session, wait_until
from tests.kit.producer import insert_rows

NAMES = TableNames(None, "queue_message", "queue_message_notify")
POLL_S = 30  # a missed wake-up would wait this long

ROLE_HOLDERS = f"""
SELECT split_part(a.application_name, ' ', 4)::int AS relay_pid
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = {WAKEUP_LOCK_CLASS + 1}::oid
  AND l.objid = 'queue_message'::regclass::oid AND l.objsubid = 2 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


async def _holders(dsn: str) -> list[int]:
    return [r["relay_pid"] for r in await pg_fetch(dsn, ROLE_HOLDERS)]


async def _sleepers(dsn: str) -> int:
    return int(await pg_fetchval(dsn, Queries(NAMES)["wakeup_sleepers"]))


async def _delivered(dsn: str, row_id: str) -> bool:
    return not await pg_fetchval(dsn, "SELECT EXISTS (SELECT 1 FROM queue_message "
                                   "WHERE id = $1::uuid)", row_id)


async def test_two_relays__one_sleeper_and_the_waiter_takes_over_when_it_is_killed(
    env: Env, start_relay
) -> None:
    async with pg_session(env.pg_dsn) as conn:
        await migrate(conn, NAMES, NotifyMode.CONDITIONAL)
        first = start_relay(poll_interval_s=POLL_S)
        second = start_relay(poll_interval_s=POLL_S)
        await wait_until(lambda: _one_holder(env.pg_dsn), what="one relay holding the sleeper role")
        holder = (await _holders(env.pg_dsn))[0]
        sleeper, waiter = (first, second) if first.pid == holder else (second, first)
        assert waiter.pid != holder
        await wait_until(lambda: _sleepers_are(env.pg_dsn, 1), what="the sleeper asleep")

        # A row while the sleeper sleeps: notified, delivered by either relay.
        [row_id] = await insert_rows(conn, env.exchange, "rk", [{}])
        await wait_until(lambda: _delivered(env.pg_dsn, row_id), timeout_s=POLL_S / 3,
                         what="delivery")

        sleeper.kill()
        await wait_until(lambda: _holder_is(env.pg_dsn, waiter.pid), timeout_s=10,
                         what="the waiter granted the sleeper role")
        # Committed right away: the new sleeper may still be on its way to the lock, so this
        # producer may skip the NOTIFY; its check after the lock must find the row.
        started = time.monotonic()
        [orphan] = await insert_rows(conn, env.exchange, "rk", [{}])
        await wait_until(lambda: _delivered(env.pg_dsn, orphan), timeout_s=POLL_S / 3,
                         what="the row committed during the hand-over, before the periodic sweep")
        print(f"delivered {time.monotonic() - started:.2f} s after its commit")
        await wait_until(lambda: _sleepers_are(env.pg_dsn, 1), what="the new sleeper asleep")
        assert waiter.alive()


@pytest.mark.timing
async def test_two_relays__the_waiter_holds_no_snapshot_for_long_so_an_index_builds_concurrently(
    env: Env, start_relay
) -> None:
    """The waiter queues for the sleeper role a slice at a time (ROLE_SLICE_S, 10 s). A
    statement waiting for a lock holds a snapshot: one that waited up to an hour kept VACUUM
    from removing the rows the relays deleted since, and made every CREATE INDEX CONCURRENTLY in
    the database (a migration's, the archive conversion's) wait for it to end."""
    async with pg_session(env.pg_dsn) as conn:
        await migrate(conn, NAMES, NotifyMode.CONDITIONAL)
        start_relay()
        start_relay()
        await wait_until(lambda: _one_holder(env.pg_dsn), what="one relay holding the sleeper role")
        await wait_until(lambda: _sleepers_are(env.pg_dsn, 1), what="the sleeper asleep")
        started = time.monotonic()
        await conn.execute("CREATE INDEX CONCURRENTLY queue_message_probe_idx "
                           "ON queue_message (created_at)", timeout=240)
        took = time.monotonic() - started
        oldest = await pg_fetchval(
            env.pg_dsn, "SELECT COALESCE(max(EXTRACT(EPOCH FROM now() - xact_start)), 0) "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_xmin IS NOT NULL AND application_name LIKE 'outbox-relay %'")
    print(f"CREATE INDEX CONCURRENTLY beside a sleeper and a waiter: {took:.1f} s; the oldest "
          f"relay transaction holding a snapshot: {float(oldest):.1f} s")
    # At most one slice of the waiter's (10 s) and the claims' short transactions: 12x headroom
    # (before, the build waited up to an hour, the waiter's whole request).
    assert took < 120.0, f"the index build waited {took:.0f} s for the relays"


async def _one_holder(dsn: str) -> bool:
    return len(await _holders(dsn)) == 1


async def _holder_is(dsn: str, pid: int) -> bool:
    return await _holders(dsn) == [pid]


async def _sleepers_are(dsn: str, n: int) -> bool:
    await asyncio.sleep(0)
    return await _sleepers(dsn) == n


async def test_sleeper_that_cannot_publish__hands_the_role_over_and_rows_flow_at_once(
    env: Env, start_relay
) -> None:
    """The sleeper kept its role while its broker connection was down: producers skipped the
    NOTIFY for it and the other replicas saw new rows only at their poll interval."""
    from urllib.parse import urlsplit

    from tests.kit.proxy import TcpProxy, via_proxy

    async with pg_session(env.pg_dsn) as conn:
        await migrate(conn, NAMES, NotifyMode.CONDITIONAL)
        parts = urlsplit(env.amqp_url)
        proxy = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672).start()
        try:
            sleeper = start_relay(poll_interval_s=POLL_S,
                                  amqp_url=via_proxy(env.amqp_url, proxy.port))
            await wait_until(lambda: _holder_is(env.pg_dsn, sleeper.pid), timeout_s=10,
                             what="the first relay holding the sleeper role")
            other = start_relay(poll_interval_s=POLL_S)
            await wait_until(lambda: _sleepers_are(env.pg_dsn, 1), what="the sleeper asleep")
            await proxy.cut()  # the sleeper's broker is gone (and stays gone)
            [first] = await insert_rows(conn, env.exchange, "rk", [{}])
            await wait_until(lambda: _delivered(env.pg_dsn, first), timeout_s=10,
                             what="a row delivered by the relay that can publish")
            await wait_until(lambda: _holder_is(env.pg_dsn, other.pid), timeout_s=10,
                             what="the role handed to the relay that can publish")
            await wait_until(lambda: _sleepers_are(env.pg_dsn, 1), what="the new sleeper asleep")
            for _ in range(3):
                started = time.monotonic()
                [row_id] = await insert_rows(conn, env.exchange, "rk", [{}])
                await wait_until(lambda rid=row_id: _delivered(env.pg_dsn, rid),  # type: ignore[misc]
                                 timeout_s=POLL_S / 3, what="a later row, before any poll")
                print(f"delivered {time.monotonic() - started:.2f} s after its commit")
            assert any(e.get("event") == "wakeup_role_released" for e in sleeper.log_events())
            assert sleeper.alive()
            assert other.alive()
        finally:
            await proxy.close()


def _healthz_connection(port: int, name: str) -> dict[str, object]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        state: dict[str, object] = json.loads(response.read())["connections"].get(name) or {}
    return state


async def test_sleeper_session_lost__shown_in_healthz_logged_once_and_taken_again(
    env: Env, start_relay
) -> None:
    """The gate's session is supervised like every other: its outage reaches /healthz and the
    log (connection_lost / connection_restored, connection=wakeup), and the relay takes the
    sleeper role again on a new session."""
    from tests.kit.ports import free_port

    async with pg_session(env.pg_dsn) as conn:
        await migrate(conn, NAMES, NotifyMode.CONDITIONAL)
        port = free_port()
        relay = start_relay(poll_interval_s=POLL_S, http_port=port)
        await wait_until(lambda: _holder_is(env.pg_dsn, relay.pid), timeout_s=10,
                         what="the relay holding the sleeper role")
        await wait_until(lambda: _sleepers_are(env.pg_dsn, 1), what="the sleeper asleep")
        state = await asyncio.to_thread(_healthz_connection, port, "wakeup")
        assert state["state"] == "up", state
        assert state["outages"] == 0, state
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'outbox-relay wakeup %'")
        assert killed == 1

        async def restored() -> bool:
            now = await asyncio.to_thread(_healthz_connection, port, "wakeup")
            return now.get("state") == "up" and now.get("outages") == 1

        await wait_until(restored, timeout_s=15, what="/healthz: wakeup up again after 1 outage")
        await wait_until(lambda: _holder_is(env.pg_dsn, relay.pid), timeout_s=10,
                         what="the sleeper role taken again on the new session")
        events = [e.get("event") for e in relay.log_events() if e.get("connection") == "wakeup"]
        assert events == ["connection_lost", "connection_restored"], events
        [row_id] = await insert_rows(conn, env.exchange, "rk", [{}])
        await wait_until(lambda: _delivered(env.pg_dsn, row_id), timeout_s=5,
                         what="a row after the new session, before any poll")
        assert relay.alive()
