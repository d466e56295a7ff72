"""Property: whatever stream name and JSON content a producer writes into the stream table, the
row reaches that stream once, as written, or waits, counted, when the broker has no such stream.

The space is what the stream table accepts: a stream name of 1 to 255 bytes of any script (the
table's CHECK; RabbitMQ's own limit for a queue or stream name), and a content any JSON value
(jsonb: nested arrays and objects, numbers of any size, strings of any script). Each example
asks the real RabbitMQ to create the stream by that name, writes the rows on the real
PostgreSQL, lets a real relay send them, and reads the stream from `first`: each row once, in
row order, its body the JSON it was written as (as jsonb prints it: the same values, numbers
exactly as decimals), its `x-outbox-id` the row id. A stream the broker refuses to create, or
cannot serve, leaves the rows in the table, where `relay status` counts them; a name no stream
can have (a CR or LF in it, or the prefix "amq.") is refused at the INSERT. Cases it found stay
as examples: any name outside ASCII broke the stream client's frames (relay/streams/wire.py
fixes it), a 254-byte name is "created" but never served, and a name with a CR or LF created a
stream without them (the broker strips them on create, not on look-up), so its rows waited for
ever (sql/migrations/0021_stream_name_check.sql)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from decimal import Decimal
from typing import Any

import asyncpg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rstream import Producer

from tests.helpers import Env
from tests.kit.stream import CREDENTIALS, STREAM_HOST, STREAM_PORT, read_stream

# PostgreSQL text holds no NUL, and jsonb refuses the escape \u0000: a producer gets an error.
_chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
# RabbitMQ 3.10 "creates" a stream whose name is too long for its data directory (from about
# 230 bytes) and never elects it a leader: its rows wait, as for a stream that does not exist.
SERVABLE_BYTES = 200
_stream_name = st.text(_chars, min_size=1, max_size=40).filter(
    lambda s: len(s.encode()) <= SERVABLE_BYTES)
_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(_chars, max_size=30),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(_chars, max_size=8), children, max_size=4),
    max_leaves=12)


def no_stream_can_have(name: str) -> bool:
    """RabbitMQ's rule (rabbit_stream_utils:enforce_correct_name): it strips CR and LF from a
    name it creates but not from one it looks up, and refuses the prefix "amq."."""
    return "\r" in name or "\n" in name or name.startswith("amq.")


async def _refused_by(dsn: str, name: str) -> str | None:
    """The constraint that refuses a row for this stream name (None: the row is written)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("INSERT INTO queue_message_stream (stream, content) VALUES ($1, '{}')",
                           name)
    except asyncpg.CheckViolationError as exc:
        return str(exc.constraint_name)
    finally:
        await conn.close()
    return None


async def _round_trip(dsn: str, name: str, contents: list[Any], servable: bool,
                      ) -> tuple[bool, list[str], list[dict[str, Any]], int]:
    """(created, ids written, messages read, rows left in the table) for one stream name."""
    producer = Producer(STREAM_HOST, STREAM_PORT, **CREDENTIALS)
    await producer.start()
    created = False
    conn = await asyncpg.connect(dsn)
    try:
        try:
            await producer.create_stream(name, exists_ok=True)
            created = True
        except Exception:  # the broker refuses the name: the rows must wait, counted
            created = False
        ids = [await conn.fetchval(
            "INSERT INTO queue_message_stream (stream, content) VALUES ($1, $2::jsonb) "
            "RETURNING id::text", name, json.dumps(c)) for c in contents]
        got: list[dict[str, Any]] = []
        if created and servable:
            deadline = time.monotonic() + 30
            while await conn.fetchval(
                    "SELECT count(*) FROM queue_message_stream WHERE stream = $1", name):
                assert time.monotonic() < deadline, f"rows for {name!r} not sent in 30 s"
                await asyncio.sleep(0.02)
            got = await read_stream(name, at_least=len(ids), quiet_s=0.3)
        else:
            await asyncio.sleep(1.0)
        left = int(await conn.fetchval(
            "SELECT count(*) FROM queue_message_stream WHERE stream = $1", name))
        await conn.execute("DELETE FROM queue_message_stream WHERE stream = $1", name)
        return created, ids, got, left
    finally:
        await conn.close()
        with contextlib.suppress(Exception):  # a refused name was never created
            await producer.delete_stream(name, missing_ok=True)
        if created:
            # The broker may still list a deleted stream for a moment; a later example drawing
            # the same name must create a new one, not find this one with its messages.
            deadline = time.monotonic() + 30
            while await producer.stream_exists(name):
                assert time.monotonic() < deadline, f"stream {name!r} still there 30 s after delete"
                await asyncio.sleep(0.05)
        await producer.close()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=_stream_name, contents=st.lists(_json, min_size=1, max_size=4))
@example(name="é" * 100, contents=[{"a": [1, 2.5, None, "\u202e"]}, 2**64, -0.0])
@example(name="é" * 127, contents=[{"too long": "for the broker's data directory"}])
@example(name="amq.reserved", contents=[{}])
@example(name="0", contents=[3.73995626663537e16])
@example(name="x\r", contents=[{}])
@example(name="a\nb", contents=[{}])
def test_stream_rows__reach_their_stream_once_as_written_or_wait_counted(
    env: Env, start_relay, name: str, contents: list[Any]
) -> None:
    """Over a minute (68-75 s): each of hypothesis's examples declares a stream on the real
    broker, writes its rows and starts a relay that sends them."""
    refused_by = asyncio.run(_refused_by(env.pg_dsn, name))
    if no_stream_can_have(name):
        assert refused_by == "queue_message_stream_name_servable", name
        return
    assert refused_by is None, (name, refused_by)
    asyncio.run(_delete_rows(env.pg_dsn, name))  # the probe's row
    if not getattr(start_relay, "started", False):
        start_relay(streams="true", stream_producers=1)
        start_relay.started = True  # one relay for every example
    servable = len(name.encode()) <= SERVABLE_BYTES
    created, ids, got, left = asyncio.run(_round_trip(env.pg_dsn, name, contents, servable))
    if not (created and servable):
        assert left == len(ids), (name, "a stream the broker cannot serve: the rows wait")
        return
    assert left == 0
    assert [m["id"] for m in got] == ids, (name, "each row once, in row order")
    for message, content in zip(got, contents, strict=True):
        # Numbers as JSON means them, exactly (jsonb keeps the decimal a producer wrote: the
        # float 3.73995626663537e+16 arrives as 37399562666353700, the same JSON number).
        assert _exact(message["body"]) == _exact(json.dumps(content)), (name, content,
                                                                         message["body"])


def _exact(text: str | bytes) -> Any:
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


async def _delete_rows(dsn: str, name: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM queue_message_stream WHERE stream = $1", name)
    finally:
        await conn.close()
