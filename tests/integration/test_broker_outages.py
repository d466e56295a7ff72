"""Broker outages after start-up back off like any other: credentials rotated under a running
relay, and a broker (or load balancer) that accepts TCP and resets during the handshake."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.chaos.harness import broker_user as temporary_broker_user
from tests.chaos.harness import rabbitmqctl
from tests.helpers import Env, pg_session, with_user
from tests.integration.test_http import http_get
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows
from tests.kit.proxy import TcpProxy, via_proxy


@pytest.fixture
def broker_user() -> Iterator[tuple[str, str]]:
    """A RabbitMQ user of this test's own with full rights on vhost /; deleted at the end."""
    with temporary_broker_user("relay_rot") as user:
        yield user


async def test_credentials_rotated_after_start__backs_off_reports_and_delivers_once_fixed(
    env: Env, consumer: Consumer, start_relay, broker_user: tuple[str, str]
) -> None:
    """A password changed under a running relay made each lane log in every 0.2 s for ever
    (about 15 logins a second per relay) while it looked healthy."""
    user, password = broker_user
    proxy = await TcpProxy(urlsplit(env.amqp_url).hostname or "127.0.0.1",
                           urlsplit(env.amqp_url).port or 5672).start()
    port = free_port()
    try:
        relay = start_relay(amqp_url=via_proxy(with_user(env.amqp_url, user, password), proxy.port),
                            http_port=port, concurrency=3)
        first = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(5))
        await consumer.wait_for(5)
        # Rotate the password and drop the relay's connection (as an operator closing it).
        rabbitmqctl("change_password", user, "rotated-" + password)
        await proxy.cut()
        await proxy.restore()
        during = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(5, 10))
        before, started = proxy.connections_made, time.monotonic()
        await asyncio.sleep(6.0)
        logins = proxy.connections_made - before
        # Backoff from 0.1-0.2 s, doubling: about six tries in six seconds (was ~90 here).
        assert logins <= 10, f"{logins} logins in {time.monotonic() - started:.1f}s"
        status, body = await http_get(port, "/readyz")
        assert status == 503, body
        # The kind of failure, never its text (which names the server): the log has the text.
        assert "BrokerRefused (details in the relay's log)" in body
        _, metrics = await http_get(port, "/metrics")
        assert 'relay_connected{server="rabbitmq"} 0.0' in metrics
        events = [e for e in relay.log_events() if e.get("connection") == "broker"]
        lost = [e for e in events if e.get("event") == "connection_lost"]
        failing = [e for e in events if e.get("event") == "connection_failing"]
        # One line when the connection went, one naming the cause: not one per attempt.
        assert len(lost) == 1, lost
        assert len(failing) == 1, failing
        assert "refused the relay's credentials" in failing[0]["error"]
        assert relay.alive()
        # The operator puts the password the relay has back: everything is delivered.
        rabbitmqctl("change_password", user, password)
        await consumer.wait_for(10, timeout_s=60)
        assert sorted(set(consumer.ids)) == sorted(first + during)
        assert await relay.stop() == 0
    finally:
        await proxy.close()


class _ResettingFront:
    """Accepts TCP and closes it at once during the handshake (a load balancer whose backend
    is down); after `open_after_s`, forwards to the broker."""

    def __init__(self, target: tuple[str, int], open_after_s: float) -> None:
        self.target = target
        self.open_at = time.monotonic() + open_after_s
        self.resets = 0
        self.port = free_port()
        self._server: asyncio.Server | None = None

    async def start(self) -> _ResettingFront:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self.open_at:
            self.resets += 1
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.read(8), timeout=2)  # the protocol header
            writer.close()  # EOF mid-handshake
            return
        up_r, up_w = await asyncio.open_connection(*self.target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_w), pump(up_r, writer))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def test_handshake_reset_by_a_front__waits_like_an_absent_broker_every_line_json(
    env: Env, consumer: Consumer, start_relay
) -> None:
    parts = urlsplit(env.amqp_url)
    front = await _ResettingFront((parts.hostname or "127.0.0.1", parts.port or 5672),
                                  open_after_s=6.0).start()
    try:
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(5))
        relay = start_relay(amqp_url=via_proxy(env.amqp_url, front.port))
        await consumer.wait_for(5, timeout_s=60)
        assert sorted(consumer.ids) == sorted(ids)
        assert front.resets >= 2
        assert relay.alive()
        assert await relay.stop() == 0
        lines = [line for line in relay.log_text().splitlines() if line.strip()]
        not_json = [line for line in lines if not _is_json(line)]
        assert not not_json, not_json[:5]
    finally:
        await front.close()


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


async def test_database_login_refused_after_start__backs_off_and_delivers_once_allowed(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """The same for PostgreSQL: a login refused after start (here the role loses LOGIN and its
    sessions are ended; this machine trusts passwords) is retried with backoff by every
    session the relay keeps, not in a loop."""

    role = f"relay_pg_{secrets.token_hex(3)}"
    async with pg_session(env.pg_dsn) as admin:
        parts = urlsplit(env.pg_dsn)
        proxy = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
        try:
            await admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
            dsn = via_proxy(with_user(env.pg_dsn, role), proxy.port)
            relay = start_relay(pg_dsn=dsn)
            first = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(5))
            await consumer.wait_for(5)
            await admin.execute(f"ALTER ROLE {role} NOLOGIN")
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE usename = $1", role)
            during = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(5, 10))
            await asyncio.sleep(1.0)
            before, started = proxy.connections_made, time.monotonic()
            await asyncio.sleep(6.0)
            logins = proxy.connections_made - before
            # Every session the relay keeps backs off: 8 logins in 6 s here.
            print(f"database logins while refused: {logins} in {time.monotonic() - started:.1f}s")
            assert logins <= 20, f"{logins} logins in {time.monotonic() - started:.1f}s"
            assert relay.alive()
            await admin.execute(f"ALTER ROLE {role} LOGIN")
            await consumer.wait_for(10, timeout_s=60)
            assert sorted(set(consumer.ids)) == sorted(first + during)
            assert await relay.stop() == 0
        finally:
            await proxy.close()
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE usename = $1", role)
            await admin.execute(f"DROP ROLE IF EXISTS {role}")
