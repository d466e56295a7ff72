"""The contract with aiormq and aio-pika internals (relay/amqp/compat.py): the hooks the relay
replaces are the ones the libraries call, and a missing internal fails the connect clearly."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import aio_pika
import pytest

from relay.amqp import compat
from relay.amqp.pipeline import AmqpPublisher, BulkPublisher, Pipeline
from relay.app import database_config, deadlines
from relay.errors import BrokerError
from relay.interfaces import Message
from relay.options import Properties
from tests.helpers import Env


def _messages(exchange: str, key: str, n: int) -> list[Message]:
    return [Message(str(uuid.uuid4()), exchange, key, b"{}", Properties(), True) for _ in range(n)]


@pytest.mark.parametrize("kind", [BulkPublisher, AmqpPublisher], ids=["bulk", "per_message"])
async def test_replaced_hooks__are_called_by_the_installed_libraries(
    amqp_url: str, broker_names: tuple[str, str], kind: type[Pipeline]
) -> None:
    exchange, _ = broker_names
    pub = kind(amqp_url, publish_timeout_s=15)  # type: ignore[call-arg]
    await pub.connect()
    try:
        before = compat.HookCalls(compat.HOOK_CALLS.confirms, compat.HOOK_CALLS.returns)
        result = await pub.publish(_messages(exchange, "rk", 5) + _messages(exchange, "nowhere", 2))
    finally:
        await pub.close()
    assert len(result.confirmed) == 5
    assert len(result.failed) == 2
    # basic.return frames reach the relay's hook on both transports ...
    assert compat.HOOK_CALLS.returns - before.returns == 2
    if kind is BulkPublisher:
        # ... and the bulk channel's acks reach its confirm hook (aiormq's futures are bypassed).
        assert compat.HOOK_CALLS.confirms > before.confirms


async def test_verify__passes_on_a_real_connection_and_names_what_is_missing(
    amqp_url: str,
) -> None:
    conn = await aio_pika.connect(amqp_url)
    try:
        channel = await conn.channel(publisher_confirms=True)
        raw = await channel.get_underlay_channel()
        compat.verify(conn, raw)  # the installed versions have everything
        stripped = SimpleNamespace(**{n: getattr(raw, n) for n in ("write_queue", "number",
                                                                   "closing", "is_closed")})
        with pytest.raises(BrokerError) as exc:
            compat.verify(conn, stripped)
    finally:
        await conn.close()
    message = str(exc.value)
    assert "aiormq.Channel._on_confirm_frame" in message
    assert "aiormq.Channel._on_return_frame" in message
    assert "aio-pika" in message
    assert "constraints.txt" in message


async def test_pg_socket__found_and_tuned_on_relay_sessions(env: Env) -> None:
    """relay/pg/compat.py reaches asyncpg's socket; a relay session has client keepalives and
    TCP_USER_TIMEOUT (a silent cut is noticed by the kernel, not after statement timeouts)."""
    import socket

    from relay.pg import compat as pg_compat
    from relay.pg.connection import connect
    from relay.pg.store import Outbox
    from relay.settings import Settings

    settings = Settings(pg_dsn=env.pg_dsn.replace("localhost", "127.0.0.1"),
                        amqp_url=env.amqp_url)
    conn = await connect(database_config(settings), "listener")
    outbox = await Outbox.open(database_config(settings))
    try:
        want = deadlines(settings).idle_in_transaction_ms
        async with outbox._pool.acquire() as pooled:
            socks = [pg_compat.socket_of(conn), pg_compat.socket_of(pooled)]
            for sock in socks:
                assert sock is not None, "asyncpg's socket is no longer where compat looks"
                if sock.family == socket.AF_UNIX:
                    continue
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == want
            # SHOW prints the value in ms without a unit (PostgreSQL 15).
            assert await pooled.fetchval("SHOW tcp_user_timeout") in (str(want), f"{want}ms")
    finally:
        await conn.close()
        await outbox.close()
