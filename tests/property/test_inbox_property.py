"""Property: whatever id a message carries, the inbox records it once and knows it again.

The space is what AMQP lets a publisher put where the inbox reads an id: the `x-outbox-id`
header, a long string or a byte array (text with NUL, text of any script, bytes that are not
UTF-8, up to far past a btree entry's size limit); the message_id property, a short string (up
to 255 bytes); a recurring row's `x-outbox-occurrence`. Each generated message goes through the
real RabbitMQ (published, then fetched: what a consumer sees, as the client library decodes it)
and then through the inbox on the real PostgreSQL, twice: the first handling runs the handler,
the second finds the key and runs nothing; the key read after the broker equals the key of what
was sent; messages with different ids never share a key. The cases found stay as examples: the
id `a@b` and the id `a` with the occurrence `b` once shared a key."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import asyncpg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relay.inbox import Inbox, message_key, migrate

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_header_value = st.one_of(
    _text,
    st.text(st.characters(exclude_categories=("Cs",)), min_size=300, max_size=1200),
    st.binary(max_size=40).map(bytearray),  # what the client library sends as bytes
    st.sampled_from(["0b9f7b1e-3c43-4c55-a1e4-7a0f6f1d2c11", "a\x00b", "", "é", "\u202e"]),
)
# message_id is an AMQP short string: at most 255 bytes once encoded.
_message_id = st.text(st.characters(exclude_categories=("Cs",)), min_size=1,
                      max_size=60).filter(lambda s: len(s.encode()) <= 255)
_message = st.fixed_dictionaries(
    {"id": st.one_of(_header_value, st.sampled_from(["a@b", "a", "hex:61", "sha256:00"])),
     "message_id": _message_id},
    optional={"occurrence": st.sampled_from(["2026-11-27T10:00:00+00:00", "", "x", "b",
                                             "b@c"])})


def _identity(m: dict[str, Any]) -> tuple[bytes, bytes | None]:
    """What tells two messages apart: the id's bytes (the message_id's when the header is
    empty) and the occurrence's, if any."""
    raw = m["id"] if m["id"] not in ("", b"") else m["message_id"]
    raw = bytes(raw) if isinstance(raw, bytearray) else raw.encode()
    occurrence = m.get("occurrence")
    return raw, None if occurrence is None else occurrence.encode()


async def _round_trip(amqp_url: str, dsn: str, sent: list[dict[str, Any]],
                      ) -> list[tuple[str | None, str | None, bool, bool]]:
    """For each message: (key of what was sent, key of what arrived, first handle ran,
    second handle ran)."""
    amqp = await aio_pika.connect(amqp_url)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            await migrate(conn)
            await conn.execute("TRUNCATE relay_inbox")
        channel = await amqp.channel()
        queue = await channel.declare_queue("", exclusive=True)
        inbox = Inbox(pool, "property")
        ran: list[str] = []

        async def handler(message: Any, conn: Any) -> None:
            ran.append(message.message_id)

        out = []
        for m in sent:
            headers: dict[str, Any] = {"x-outbox-id": m["id"]}
            if "occurrence" in m:
                headers["x-outbox-occurrence"] = m["occurrence"]
            await channel.default_exchange.publish(
                aio_pika.Message(b"{}", headers=headers, message_id=m["message_id"]),
                routing_key=queue.name)
            got = await queue.get(timeout=10)
            await got.ack()
            key = message_key(got.headers, got.message_id)
            first = second = False
            if key is not None:
                first = await inbox.handle(key, got, handler)
                second = await inbox.handle(key, got, handler)
            out.append((message_key(headers, m["message_id"]), key, first, second))
        return out
    finally:
        await pool.close()
        await amqp.close()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sent=st.lists(_message, min_size=1, max_size=8))
@example(sent=[{"id": "a\x00b", "message_id": "m"}, {"id": bytearray(b"\xff"), "message_id": "m"},
               {"id": "x" * 3000, "message_id": "m"}, {"id": "", "message_id": "fallback"}])
@example(sent=[{"id": "a@b", "message_id": "m"}, {"id": "a", "message_id": "m", "occurrence": "b"},
               {"id": "hex:610062", "message_id": "m"}, {"id": "a\x00b", "message_id": "m"}])
def test_inbox__every_id_a_publisher_can_send_is_recorded_once_and_known_again(
    empty_db: str, amqp_url: str, sent: list[dict[str, Any]]
) -> None:
    results = asyncio.run(_round_trip(amqp_url, empty_db, sent))
    seen: dict[str, tuple[bytes, bytes | None]] = {}
    for m, (sent_key, key, first, second) in zip(sent, results, strict=True):
        assert key == sent_key, (m, sent_key, key)
        assert key is not None, m  # a message_id is always there to fall back on
        assert second is False, (m, "the second handling ran the handler again")
        assert first is (key not in seen), (m, "a new key runs the handler, a known one not")
        assert seen.setdefault(key, _identity(m)) == _identity(m), (
            m, "two different ids share a key")
