"""A 10 s network cut between the relay and each server, through a TCP proxy the test
controls: nothing is lost, the relay claims nothing while RabbitMQ is away, each outage is
logged once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.chaos.harness import RobustConsumer, assert_drained, produce, relays, report
from tests.chaos.proxy import TcpProxy
from tests.helpers import Env, wait_until

pytestmark = pytest.mark.chaos

CUT_S = 10.0


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = netloc[0] + "@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


async def _proxy_for(url: str) -> TcpProxy:
    parts = urlsplit(url)
    return await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0).start()


async def test_network_cut__ten_seconds_to_each_server_loses_nothing(
    env: Env, tmp_path: Path
) -> None:
    pg_proxy = await _proxy_for(env.pg_dsn)
    amqp_proxy = await _proxy_for(env.amqp_url)
    consumer = await RobustConsumer(env.amqp_url, env.queue).start()
    try:
        with relays(env, tmp_path, pg_dsn=_via(env.pg_dsn, pg_proxy.port),
                    amqp_url=_via(env.amqp_url, amqp_proxy.port), reconnect_max_s=2,
                    poll_interval_s=1) as group:
            relay = group.start()
            # The producer talks to PostgreSQL directly: rows keep arriving during both cuts.
            producer = asyncio.ensure_future(produce(env, 9_000, chunk=100, interval_s=0.3))
            await wait_until(lambda: consumer.distinct() > 1000, what="flow before the cut")

            pg_proxy.cut()
            await asyncio.sleep(CUT_S)
            pg_proxy.restore()
            await wait_until(lambda: _database_events(group, "connection_restored"), timeout_s=30,
                             what="connection_restored (database)")

            before = consumer.distinct()
            amqp_proxy.cut()
            try:
                await asyncio.sleep(CUT_S / 2)
                # While RabbitMQ is away the relay claims nothing: every row is lockable.
                total, lockable = await _lockable_rows(env.pg_dsn)
                assert total > 0, "rows kept coming during the cut"
                assert lockable == total, "the relay holds no claim while the broker is away"
                await asyncio.sleep(CUT_S / 2)
            finally:
                amqp_proxy.restore()

            ids = await producer
            await consumer.wait_all(ids, timeout_s=90, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn)
            lost, _duplicates = report("network cut 10 s (pg, then amqp)", ids, consumer)
            assert lost == 0
            assert before > 1000
            assert relay.alive()
            assert len(_database_events(group, "connection_lost")) == 1
            assert len(group.events("broker_connection_lost")) == 1
            assert len(group.events("broker_reconnected")) == 1
            # The proxies run on this event loop: wait for the exit without blocking it.
            assert await asyncio.to_thread(relay.terminate, 15) == 0
    finally:
        await consumer.stop()
        await pg_proxy.close()
        await amqp_proxy.close()


async def _lockable_rows(dsn: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            total = await conn.fetchval("SELECT count(*) FROM queue_message")
            lockable = await conn.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM queue_message FOR UPDATE SKIP LOCKED) AS s")
            await conn.execute("ROLLBACK")
            await conn.execute("BEGIN")
    finally:
        await conn.close()
    return int(total), int(lockable)


def _database_events(group: object, event: str) -> list[object]:
    """The worker pool's Supervisor events (the LISTEN session logs its own)."""
    found = group.events(event)  # type: ignore[attr-defined]
    return [e for e in found if e.get("connection") == "database"]
