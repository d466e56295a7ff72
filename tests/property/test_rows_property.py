"""Property: whatever a producer writes, every row gets its verdict, good rows flow, nothing is
lost, and the relay neither stops nor storms the broker. Real `relay run`, real servers.

hypothesis generates rows across the input space (options of every key with wrong types and
out-of-range values, unicode and oversize strings, deep nesting, header tables of every value
type, exchange names and routing keys of any length and charset, messageIds and x-outbox-id
headers that collide with row ids). The examples are collected first and then run through one
relay together with good rows (a relay per example would not fit the budget), so a failure
names the rows to keep as plain regression tests (tests/integration/test_verdicts.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from relay.interfaces import Reason
from tests.helpers import Env, count_rows, dead_reasons, pg_session, wait_until
from tests.kit.consumer import Consumer

EXAMPLES = 300
ROW = tuple[str, str | None, str | None, Any, Any, dict[str, Any]]
MAX_BYTES = 65536  # RELAY_MAX_MESSAGE_BYTES of this test's relays
RESERVED_EXCHANGES = ["amq.rabbitmq.trace", "amq.direct", "amq.topic", "amq.fanout",
                      "amq.headers", "amq.match"]
# Columns a classic table's producers may write, over their whole range.
_COLUMNS: dict[str, Any] = {
    "attempts": st.sampled_from([-(2**31), -1, 0, 2**31 - 2, 2**31 - 1]),
    "available_at": st.sampled_from(["-infinity", "1970-01-01", "now", "infinity",
                                     "294276-12-31"]),
    "created_at": st.sampled_from(["-infinity", "1970-01-01", "now", "infinity",
                                   "4713-01-01 BC"]),
}

# PostgreSQL text and jsonb cannot hold NUL; everything else goes.
_chars = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
_text = st.text(_chars, max_size=40)
_long_text = st.text(_chars, min_size=120, max_size=320)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), _text)
_json = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_text, inner, max_size=4), max_leaves=12)


def _deep(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"d": value} if i % 2 else [value]
    return value


_headers = st.one_of(
    st.dictionaries(st.one_of(_text, _long_text, st.sampled_from(["x-outbox-id", "CC", "BCC"])),
                    _json, max_size=5),
    st.integers(1, 120).map(lambda d: {"deep": _deep(d)}),
    _json,
)
_timestamp = st.one_of(st.integers(-10, 10**17), st.floats(allow_nan=False, allow_infinity=False),
                       st.sampled_from(["2025-11-23T12:13:20Z", "2025-11-23", "soon", ""]), _json)
# Numerals RabbitMQ does not read as digits (it parses ASCII only): Arabic-Indic, full-width,
# Devanagari and any other decimal digit, as whole strings or mixed into ASCII ones.
_non_ascii_digits = st.text(st.one_of(st.sampled_from("٠١٢٣٤٥٦٧٨٩０１２３४५६"),
                                      st.characters(whitelist_categories=("Nd",))),
                            min_size=1, max_size=8)
_numeral = st.one_of(_non_ascii_digits,
                     st.tuples(st.integers(1, 10**6), _non_ascii_digits).map(
                         lambda t: f"{t[0]}{t[1]}"))
# Short TTLs could expire in the queue before the consumer reads them: only long or bad ones.
_expiration = st.one_of(st.integers(600_000, 10**13), st.integers(-5, -1),
                        st.sampled_from(["600000", "+600000", "0600000", "1.5", "abc", "-1", "",
                                         " 600000", "600000 "]),
                        _numeral, _json)
_string_option = st.one_of(_text, _long_text, _json)
_OPTIONS: dict[str, Any] = {
    "contentType": _string_option, "content_type": _string_option,
    "contentEncoding": _string_option, "persistent": st.one_of(st.booleans(), _json),
    "deliveryMode": st.one_of(st.sampled_from([1, 2, 0, 3, True]), _json),
    "headers": _headers, "priority": st.one_of(st.integers(-5, 300), _numeral, _json),
    "correlationId": _string_option, "replyTo": _string_option, "expiration": _expiration,
    "type": _string_option, "appId": _string_option,
    "userId": st.one_of(st.sampled_from(["guest", "mallory"]), _json),
    "timestamp": st.one_of(_timestamp, _numeral),
    # mandatory=false would make an unroutable row published and dropped: true or nonsense.
    "mandatory": st.one_of(st.just(True), _scalar.filter(lambda v: v is not False)),
}


@st.composite
def _batch(draw: st.DrawFn, exchange: str, queue: str, good_ids: list[str]) -> list[ROW]:
    ids = [str(u) for u in draw(st.lists(st.uuids(), min_size=1, max_size=5, unique=True))]
    return [draw(_row(exchange, queue, rid, ids + good_ids)) for rid in ids]


@st.composite
def _row(draw: st.DrawFn, exchange: str, queue: str, row_id: str, ids: list[str]) -> ROW:
    target = draw(st.sampled_from(["test", "default", "missing", "any", "reserved"]))
    if target == "reserved":
        # RabbitMQ's own exchanges: internal ones close the channel (403) when published to.
        ex, key = draw(st.sampled_from(RESERVED_EXCHANGES)), "rk"
    elif target == "test":
        ex, key = exchange, draw(st.one_of(st.just("rk"), _text, _long_text))
    elif target == "default":
        ex, key = "", draw(st.one_of(st.just(queue), _text))
    elif target == "missing":
        ex, key = f"{exchange}-missing-{draw(st.integers(0, 3))}", "rk"
    else:
        ex, key = draw(st.one_of(_text, _long_text)), draw(st.one_of(_text, _long_text))
    keys = draw(st.lists(st.one_of(st.sampled_from(sorted(_OPTIONS)), _text), max_size=4,
                         unique=True))
    options: Any = {
        k: draw(_OPTIONS.get(k, _json)) for k in keys
    }
    collide = draw(st.sampled_from(["none", "own", "other", "header-other"]))
    assert isinstance(options, dict)
    if collide == "own":
        options["messageId"] = row_id
    elif collide in ("other", "header-other"):
        other = draw(st.sampled_from(ids))
        if collide == "other":
            options["messageId"] = other
        else:
            headers = options.get("headers")
            options["headers"] = {**(headers if isinstance(headers, dict) else {}),
                                  "x-outbox-id": other}
    options = draw(st.one_of(st.just(options), st.just(None), st.just([1, 2]), _scalar))
    columns = {k: draw(v) for k, v in _COLUMNS.items() if draw(st.integers(0, 3)) == 0}
    body = draw(st.one_of(_json, st.text(_chars, max_size=2000),
                          # near RELAY_MAX_MESSAGE_BYTES (as this test sets it), either side
                          st.integers(MAX_BYTES - 40, MAX_BYTES + 40).map(lambda n: "b" * n)))
    return row_id, ex, key, body, options, columns


def _generate(env: Env, good: list[ROW]) -> list[ROW]:
    """Collect every generated row (deterministic: derandomized, no example database)."""
    rows: list[ROW] = []
    good_ids = [r[0] for r in good]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(_batch(env.exchange, env.queue, good_ids))
    def collect(batch: list[ROW]) -> None:
        # Derandomized uuids repeat across examples: give each example's rows fresh ids (and
        # keep its collisions pointing at them).
        fresh = {r[0]: str(uuid.uuid4()) for r in batch}
        rows.extend(_renamed(r, fresh) for r in batch)

    collect()
    return rows


def _renamed(row: ROW, fresh: dict[str, str]) -> ROW:
    rid, ex, key, body, options, columns = row
    if isinstance(options, dict):
        options = dict(options)
        mid = options.get("messageId")
        if isinstance(mid, str) and mid in fresh:
            options["messageId"] = fresh[mid]
        headers = options.get("headers")
        own = headers.get("x-outbox-id") if isinstance(headers, dict) else None
        if isinstance(headers, dict) and isinstance(own, str) and own in fresh:
            options["headers"] = {**headers, "x-outbox-id": fresh[own]}
    return fresh[rid], ex, key, body, options, columns


async def _insert(dsn: str, rows: list[ROW]) -> None:
    async with pg_session(dsn) as conn:
        # Hand-written: the space of rows, attempts and dates included, is the subject.
        await conn.executemany(
            "INSERT INTO queue_message (id, exchange, routing_key, content, options, attempts, "
            "available_at, created_at) VALUES ($1::uuid, $2, $3, $4::jsonb, $5::jsonb, "
            "COALESCE($6::integer, 0), COALESCE($7::text::timestamptz, now()), "
            "COALESCE($8::text::timestamptz, now()))",
            [(rid, ex, key, json.dumps(body), None if opts is None else json.dumps(opts),
              cols.get("attempts"), cols.get("available_at"), cols.get("created_at"))
             for rid, ex, key, body, opts, cols in rows],
        )


def _good(env: Env, n: int) -> list[ROW]:
    return [(str(uuid.uuid4()), env.exchange, "rk", {"good": i}, None, {}) for i in range(n)]


def _never_due(row: ROW) -> bool:
    """available_at 'infinity' or far ahead: the row stays, with no verdict, by design."""
    return row[5].get("available_at") in ("infinity", "294276-12-31")


_CODES = "|".join(r.value for r in Reason)
_REASON = re.compile(rf"^(gave up after \d+ attempts: )?({_CODES}): .")


async def test_generated_rows__each_gets_its_verdict_good_rows_flow_nothing_lost(
    env: Env, consumer: Consumer, start_relay
) -> None:
    good = _good(env, 200)
    generated = _generate(env, good)
    mixed = [row for pair in zip(good, generated, strict=False) for row in pair]
    mixed += generated[len(good):] + good[len(generated):]
    await _insert(env.pg_dsn, mixed)
    # Two relays of three lanes each, as in production.
    relays = [start_relay(max_attempts=1, batch_size=100, publish_timeout_s=10,
                          shutdown_timeout_s=15, max_message_bytes=MAX_BYTES, concurrency=3)
              for _ in range(2)]
    waiting = sum(1 for r in generated if _never_due(r))
    await wait_until(lambda: _drained(env, waiting), timeout_s=120, interval_s=0.5,
                     what="every generated row settled (published or dead)")
    await asyncio.sleep(0.5)  # let the last deliveries reach the consumer
    receipts = Counter(str((m.headers or {}).get("x-outbox-id")) for m in consumer.messages)
    delivered = set(receipts)
    dead = await dead_reasons(env.pg_dsn)

    assert {r[0] for r in good} <= delivered, "a good row was not delivered"
    parked_good = [r[0] for r in good if r[0] in dead]
    assert not parked_good, f"good rows parked: {parked_good[:3]}"
    duplicates = {rid: n for rid, n in receipts.items() if n > 1}
    assert not duplicates, f"rows delivered more than once: {list(duplicates.items())[:3]}"
    gone_unacked = [r for r in generated if r[0] not in delivered and r[0] not in dead
                    and not _never_due(r)]
    assert not gone_unacked, f"rows deleted without their own ack: {gone_unacked[:3]}"
    both = [rid for rid in dead if rid in delivered]
    assert not both, f"rows both delivered and dead-lettered: {both[:3]}"
    bad_reasons = {rid: r for rid, r in dead.items() if not _REASON.match(r)}
    assert not bad_reasons, f"dead letters without a reason code: {list(bad_reasons.items())[:3]}"

    for relay in relays:
        # No reconnect storm: the first connection held throughout.
        restored = [e for e in relay.log_events() if e.get("event") == "connection_restored"
                    and e.get("connection") == "broker"]
        assert not restored, f"the broker connection was re-established {len(restored)} times"
    # Ids parked before and written again by a producer: each new row is delivered with its
    # own content, and the old dead letter stays as it was.
    parked = await count_rows(env.pg_dsn, "queue_message_dead")
    reused = sorted(dead)[:20]
    again = [(rid, env.exchange, "rk", {"reused": i}, None, {}) for i, rid in enumerate(reused)]
    later = _good(env, 20)
    await _insert(env.pg_dsn, again + later)
    wanted = {r[0] for r in again + later}
    await wait_until(lambda: wanted <= {
        str((m.headers or {}).get("x-outbox-id")) for m in consumer.messages},
        timeout_s=30, what="rows inserted afterwards (reused ids included) delivered")
    assert await count_rows(env.pg_dsn, "queue_message_dead") == parked
    assert set(reused) <= set(await dead_reasons(env.pg_dsn)), "a dead letter was overwritten"
    assert all(relay.alive() for relay in relays)
    print(f"\nproperty run: {len(generated)} generated rows, {len(dead)} dead, "
          f"{len(delivered & {r[0] for r in generated})} delivered, {waiting} never due; "
          f"{len(good)} good rows, {len(reused)} reused ids")


async def _drained(env: Env, waiting: int) -> bool:
    return await count_rows(env.pg_dsn) == waiting
