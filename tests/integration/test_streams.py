"""Rows for RabbitMQ streams (docs/streams.md) against the real servers: a relay with
RELAY_STREAMS=true sends the rows of the stream table over the stream protocol, each once; a
relay that takes a producer over after its owner died (the broker had stored a batch, the
owner had not deleted its rows) sends none of them again; rows for a stream that does not exist
wait for it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay.streams.producer import Outgoing, SlotProducer, StreamServer
from tests.chaos.harness import broker_user, rabbitmqctl
from tests.helpers import (
    RELAY_BIN,
    Env,
    count_rows,
    pg_execute,
    pg_fetch,
    pg_fetchval,
    pg_session,
    wait_until,
)
from tests.integration.test_http import http_get
from tests.integration.test_stream_producers import slot_name
from tests.kit.ports import free_port
from tests.kit.stream import (
    CREDENTIALS,
    STREAM_HOST,
    STREAM_PORT,
    STREAM_TABLE,
    a_stream,
    insert_stream_rows,
    read_stream,
    stream_table_empty,
)

SERVER = StreamServer(STREAM_HOST, STREAM_PORT, **CREDENTIALS)


@pytest.fixture
async def stream() -> AsyncIterator[str]:
    async with a_stream(f"relay-test-{uuid.uuid4().hex[:10]}") as name:
        yield name


async def test_streams__every_row_once_in_the_stream_in_row_order(
    env: Env, stream: str, start_relay
) -> None:
    ids = await insert_stream_rows(env.pg_dsn, stream, 500)
    start_relay(streams="true", stream_producers=1)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the stream table emptied")
    got = await read_stream(stream, at_least=500)
    assert [m["id"] for m in got] == ids, "each row once, in the order of the rows (one slot)"
    assert [m["message_id"] for m in got] == ids
    assert [json.loads(m["body"])["n"] for m in got] == list(range(1, 501))


async def test_streams__a_row_too_large_for_a_frame_is_parked_and_the_rows_after_it_go(
    env: Env, stream: str, start_relay
) -> None:
    """A message larger than the stream connection's frame_max (1 MiB by default) would make the
    broker close the connection at every try and hold its slot's later rows for ever: it is
    parked with its reason, and the rows on either side go, in order. One just under the
    limit still goes."""
    pads = [0, 1_040_000, 0, 1_100_000, 0]
    ids = []
    for pad in pads:
        ids += [r["id"] for r in await pg_fetch(
            env.pg_dsn, "INSERT INTO queue_message_stream (stream, content) "
            "VALUES ($1, jsonb_build_object('pad', repeat('x', $2))) RETURNING id::text",
            stream, pad)]
    port = free_port()
    relay = start_relay(streams="true", stream_producers=1, http_port=port)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the stream table emptied")
    got = await read_stream(stream, at_least=4)
    assert [m["id"] for m in got] == [ids[0], ids[1], ids[2], ids[4]]
    assert len(got[1]["body"]) > 1_040_000
    parked = await pg_fetch(env.pg_dsn, "SELECT id::text, stream, reason, "
                            "octet_length(content::text) AS n FROM queue_message_stream_dead")
    assert [(p["id"], p["stream"]) for p in parked] == [(ids[3], stream)]
    assert parked[0]["n"] > 1_100_000, "the row parked whole"
    assert "over the stream connection's frame_max of 1,048,576 bytes" in parked[0]["reason"]
    assert relay_status(env)["stream_dead_rows"] == 1

    async def metric_shows_it() -> bool:
        _, text = await http_get(port, "/metrics")
        return "\nrelay_stream_dead_rows 1.0" in text and "\nrelay_stream_rows 0.0" in text

    await wait_until(metric_shows_it, timeout_s=30, what="relay_stream_dead_rows 1 in /metrics")
    assert relay.terminate() == 0
    # The operator lists them and, once the broker's limit is raised, moves them back.
    listed = json.loads(relay_cmd(env, "dead", "list", "--streams", "--json"))
    assert [(r["id"], r["stream"]) for r in listed] == [(ids[3], stream)]
    assert listed[0]["bytes"] > 1_100_000
    assert "frame_max" in listed[0]["reason"]
    out = relay_cmd(env, "dead", "replay", "--streams", ids[3], str(uuid.uuid4()))
    assert "moved 1 parked stream row(s) back" in out
    assert "no parked stream row" in out
    back = await pg_fetch(env.pg_dsn, "SELECT id::text, octet_length(content::text) AS n "
                          "FROM queue_message_stream")
    assert [(r["id"], r["n"]) for r in back] == [(ids[3], parked[0]["n"])]
    assert await count_rows(env.pg_dsn, "queue_message_stream_dead") == 0
    refused = relay_cmd(env, "dead", "replay", "--streams", expect=2)
    assert "replay what? give IDs, --reason CODE or --all" in refused
    assert "Traceback" not in refused


async def test_streams__replay_moves_an_id_once_and_never_over_a_row_still_waiting(
    env: Env, stream: str
) -> None:
    """An id parked twice (replayed, then parked again) moves back once, its latest parking; a
    parked id whose row is in the stream table again stays parked instead of failing the whole
    replay on the table's key."""
    twice, waiting, plain = (str(uuid.uuid4()) for _ in range(3))
    # Hand-written INSERTs: parked rows as the relay leaves them are the subject.
    await pg_fetch(env.pg_dsn, "INSERT INTO queue_message_stream_dead "
                   "(id, stream, content, created_at, reason) VALUES "
                   "($1, $4, '{\"v\": 1}', now(), 'first'), "
                   "($1, $4, '{\"v\": 2}', now(), 'second'), "
                   "($2, $4, '{}', now(), 'r'), ($3, $4, '{}', now(), 'r')",
                   twice, waiting, plain, stream)
    await pg_fetch(env.pg_dsn, "INSERT INTO queue_message_stream (id, stream, content) "
                   "VALUES ($1, $2, '{}')", waiting, stream)
    out = relay_cmd(env, "dead", "replay", "--streams", "--all")
    assert "moved 2 parked stream row(s) back" in out
    back = await pg_fetch(env.pg_dsn, "SELECT id::text, content->>'v' AS v "
                          "FROM queue_message_stream ORDER BY seq")
    assert [(r["id"], r["v"]) for r in back] == [(waiting, None), (twice, "2"), (plain, None)]
    left = await pg_fetch(env.pg_dsn, "SELECT id::text, reason FROM queue_message_stream_dead "
                          "ORDER BY dead_id")
    assert [(r["id"], r["reason"]) for r in left] == [(twice, "first"), (waiting, "r")]


async def test_streams__replay_by_reason_moves_that_code_only(env: Env, stream: str) -> None:
    """`relay dead replay --streams --reason too_large` moves the rows parked with that reason
    code, not one whose reason text merely mentions it; text with a ':' is refused."""
    big, other = str(uuid.uuid4()), str(uuid.uuid4())
    await pg_fetch(env.pg_dsn, "INSERT INTO queue_message_stream_dead "
                   "(id, stream, content, created_at, reason) VALUES "
                   "($1, $3, '{}', now(), 'too_large: 2 MiB over the frame_max'), "
                   "($2, $3, '{}', now(), 'internal: not too_large at all')",
                   big, other, stream)
    assert "a reason code" in relay_cmd(env, "dead", "replay", "--streams", "--reason",
                                        "too_large: 2 MiB", expect=2)
    out = relay_cmd(env, "dead", "replay", "--streams", "--reason", "too_large")
    assert "moved 1 parked stream row(s) back" in out
    back = await pg_fetch(env.pg_dsn, "SELECT id::text FROM queue_message_stream")
    assert [r["id"] for r in back] == [big]
    left = await pg_fetch(env.pg_dsn, "SELECT id::text FROM queue_message_stream_dead")
    assert [r["id"] for r in left] == [other]


SLEEPERS = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND mode = 'ExclusiveLock' AND objid = 'queue_message_stream'::regclass::oid "
            "AND objsubid = 2 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")


async def test_streams__an_idle_relay_is_woken_by_a_notify_and_producers_send_none_else(
    env: Env, stream: str, start_relay
) -> None:
    """With no relay asleep a producer's INSERT sends no NOTIFY. A relay whose slots found
    nothing holds the stream table's wake-up lock and LISTENs: an INSERT then sends one (the
    test hears it too), and the row goes."""
    first = await insert_unannounced(env.pg_dsn, stream, "no relay asleep")
    start_relay(streams="true", stream_producers=2)
    await wait_until(lambda: _sleepers(env.pg_dsn, 1), timeout_s=30,
                     what="the idle relay holding the stream wake-up lock")
    heard: list[str] = []
    async with pg_session(env.pg_dsn) as listener:
        await listener.add_listener(STREAM_CHANNEL, lambda *args: heard.append(args[3]))
        second = await insert_stream_rows(env.pg_dsn, stream, 1)
        got = await read_stream(stream, at_least=2)
        assert [m["id"] for m in got] == first + second
        assert heard == [""], "the producer woke the sleeping relay"


async def test_streams__notify_off_disables_the_stream_wake_up_and_rows_still_go(
    env: Env, stream: str, start_relay
) -> None:
    """`RELAY_NOTIFY=off` (producers using two-phase commit cannot NOTIFY) turns the stream
    table's trigger off too: a sleeping relay is not notified, and finds the row by polling."""
    relay_cmd(env, "migrate", notify="off")
    start_relay(streams="true", stream_producers=1)
    await wait_until(lambda: _sleepers(env.pg_dsn, 1), timeout_s=30,
                     what="the idle relay holding the stream wake-up lock")
    rows = await insert_unannounced(env.pg_dsn, stream, "notify off")
    got = await read_stream(stream, at_least=1)
    assert [m["id"] for m in got] == rows


STREAM_CHANNEL = "queue_message_notify_stream"


async def insert_unannounced(dsn: str, stream: str, why: str) -> list[str]:
    """Insert one row for `stream` and check that it sent no NOTIFY; its id."""
    heard: list[str] = []
    async with pg_session(dsn) as listener:
        await listener.add_listener(STREAM_CHANNEL, lambda *args: heard.append(args[3]))
        rows = await insert_stream_rows(dsn, stream, 1)
        # Notifications arrive in commit order: once our marker is heard, a NOTIFY of the
        # INSERT before it would have been too.
        await pg_execute(dsn, f"NOTIFY {STREAM_CHANNEL}, 'marker'")
        await wait_until(lambda: _heard(heard, "marker"), timeout_s=10, what="the marker")
    assert heard == ["marker"], f"{why}: the producer sent no NOTIFY"
    return rows


async def _heard(heard: list[str], payload: str) -> bool:
    return payload in heard


async def _sleepers(dsn: str, n: int) -> bool:
    return await pg_fetchval(dsn, SLEEPERS) == n


def relay_cmd(env: Env, *args: str, expect: int = 0, **settings: str) -> str:
    """A relay command for the test's table (and `settings`); its output (stdout when it
    succeeds, stderr when it fails), once it exited with `expect`."""
    done = subprocess.run([RELAY_BIN, *args], env=env.relay_env(**settings), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == expect, done.stderr
    return done.stdout if expect == 0 else done.stderr


def relay_status(env: Env) -> dict[str, object]:
    """`relay status --json` for the test's table."""
    done = subprocess.run([RELAY_BIN, "status", "--json"], env=env.relay_env(),
                          capture_output=True, text=True, timeout=60, check=True)
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


async def test_streams__a_takeover_settles_what_the_broker_stored_without_sending_it_again(
    env: Env, stream: str, start_relay, tmp_path: Path
) -> None:
    """The owner of slot 0 gave 300 rows their publishing ids, sent the first 200, the broker
    stored them, and it died before deleting them. The relay that takes slot 0 over asks the
    broker, deletes those 200 unsent, and sends the last 100."""
    ids = await insert_stream_rows(env.pg_dsn, stream, 300)
    # What the dead owner's assignment left: slot 0, publishing ids 1..300 in row order.
    await pg_execute(env.pg_dsn, "INSERT INTO queue_message_stream_slots (slot) VALUES (0)")
    await pg_execute(
        env.pg_dsn, "UPDATE queue_message_stream AS t SET slot = 0, publishing_id = o.n "
        "FROM (SELECT id, row_number() OVER (ORDER BY seq) AS n FROM queue_message_stream) o "
        "WHERE t.id = o.id")
    await pg_execute(env.pg_dsn, "INSERT INTO queue_message_stream_seq VALUES (0, $1, 300)",
                     stream)
    rows = await pg_fetch(env.pg_dsn, "SELECT id::text, content::text, publishing_id "
                          "FROM queue_message_stream ORDER BY publishing_id")
    owner = SlotProducer(SERVER, await slot_name(env.pg_dsn, 0))
    await owner.start()
    try:
        result = await owner.send(stream, [Outgoing(r["id"], r["content"].encode(),
                                                    r["publishing_id"]) for r in rows[:200]],
                                  timeout_s=20)
        assert len(result.confirmed) == 200
        assert await owner.last_stored(stream) == 200
    finally:
        await owner.close()
    relay = start_relay(streams="true", stream_producers=1)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the stream table emptied")
    got = await read_stream(stream, at_least=300)
    assert [m["id"] for m in got] == ids, "the stored 200 not again, the other 100 once"
    said = [e for e in relay.log_events() if e.get("event") == "stream_rows_stored_before"]
    assert [(e["last_publishing_id"], e["rows"]) for e in said] == [(200, 200)]


async def test_streams__a_row_sent_again_with_its_id_is_dropped_by_the_broker(
    stream: str
) -> None:
    """The contract the design rests on (rstream and the broker): a named producer's message
    with a publishing id at or below the last stored is confirmed and not written, also from
    a new connection."""
    for attempt in range(2):
        producer = SlotProducer(SERVER, "relay-test-dedupe")
        await producer.start()
        try:
            result = await producer.send(stream, [Outgoing(f"m{i}", b"{}", i)
                                                  for i in range(1, 11)], timeout_s=20)
            assert len(result.confirmed) == 10, (attempt, result)
            assert await producer.last_stored(stream) == 10
        finally:
            await producer.close()
    got = await read_stream(stream, at_least=10)
    assert [m["id"] for m in got] == [f"m{i}" for i in range(1, 11)]


async def test_streams__a_slot_opens_streams_on_one_locator_connection_kept_open(
    stream: str
) -> None:
    """A slot's producer sends to one stream, then another, then asks the broker for its last
    stored ids: one locator connection serves it all, open from start to close (the client
    would close it at each new stream, waiting 200 ms before that stream's first message)."""
    producer = SlotProducer(SERVER, "relay-test-locator")
    await producer.start()
    try:
        locator = await producer._producer.default_client
        async with a_stream(f"relay-test-{uuid.uuid4().hex[:10]}") as other:
            for name in (stream, other):
                result = await producer.send(name, [Outgoing(f"{name}-1", b"{}", 1)],
                                             timeout_s=20)
                assert result.confirmed == [f"{name}-1"], result
                assert await producer.last_stored(name) == 1
                assert await producer._producer.default_client is locator
                assert locator.is_connection_alive()
    finally:
        await producer.close()
    assert not locator.is_connection_alive()


async def test_streams__rows_for_a_missing_stream_wait_for_it_and_hold_back_no_other(
    env: Env, stream: str, start_relay
) -> None:
    """1,500 rows for a stream that does not exist (more than a round's 1,000) come first in
    the one slot; the rows for a stream that exists, written after them, still go, and the
    missing stream is said once, not at every try."""
    name = f"a-missing-{uuid.uuid4().hex[:10]}"  # sorts before the other stream's name
    ids = await insert_stream_rows(env.pg_dsn, name, 1500)
    others = await insert_stream_rows(env.pg_dsn, stream, 20)
    relay = start_relay(streams="true", stream_producers=1)
    got_others = await read_stream(stream, at_least=20)
    assert [m["id"] for m in got_others] == others
    await wait_until(lambda: any(e.get("event") == "stream_missing"
                                 for e in relay.log_events()), timeout_s=30,
                     what="the relay saying the stream is missing")
    await asyncio.sleep(2.0)  # rounds go by: still said once
    said = [e for e in relay.log_events() if e.get("event") == "stream_missing"]
    assert len(said) == 1, said
    assert await count_rows(env.pg_dsn, STREAM_TABLE) == 1500
    doc = relay_status(env)
    assert doc["stream_rows"] == 1500, "relay status counts the rows waiting for streams"
    assert isinstance(doc["stream_oldest_age_s"], float)
    async with a_stream(name):
        await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                         what="the stream table emptied once the stream exists")
        got = await read_stream(name, at_least=1500)
    assert [m["id"] for m in got] == ids
    assert any(e.get("event") == "stream_available" for e in relay.log_events())


async def test_streams__two_relays_share_the_producer_slots(
    env: Env, stream: str, start_relay
) -> None:
    """Four slots, two relays: the first takes all four, and gives two back when the second
    arrives; rows still go once."""
    first = start_relay(streams="true", stream_lease_s=2)
    await wait_until(lambda: _owners(env.pg_dsn, {4}), timeout_s=30,
                     what="the first relay owning the four slots")
    second = start_relay(streams="true", stream_lease_s=2)
    await wait_until(lambda: _owners(env.pg_dsn, {2}), timeout_s=30,
                     what="two relays owning two slots each")
    ids = await insert_stream_rows(env.pg_dsn, stream, 2000)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the stream table emptied")
    got = await read_stream(stream, at_least=2000)
    assert sorted(m["id"] for m in got) == sorted(ids)
    assert any(e.get("event") == "stream_slot_given_back" for e in first.log_events())
    assert second.alive()


async def _owners(dsn: str, counts: set[int]) -> bool:
    """Every owning relay holds one of `counts` slots, and all four are owned."""
    rows = await pg_fetch(dsn, "SELECT owner, count(*) AS n FROM queue_message_stream_slots "
                          "WHERE owner IS NOT NULL AND lease_until > now() GROUP BY owner")
    return sum(r["n"] for r in rows) == 4 and {r["n"] for r in rows} == counts


async def test_streams__sessions_ended_by_the_server_come_back_and_rows_written_after_go(
    env: Env, stream: str, start_relay
) -> None:
    """Every session of the relay ended by the server (an admin's pg_terminate_backend, a
    failover, a restart): the stream side opens new ones and the rows written after go."""
    first = await insert_stream_rows(env.pg_dsn, stream, 50)
    relay = start_relay(streams="true", stream_producers=1, reconnect_max_s=1)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the first rows sent")
    ended = await pg_fetchval(
        env.pg_dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name LIKE 'outbox-relay %' AND datname = current_database()")
    assert ended >= 2, ended
    after = await insert_stream_rows(env.pg_dsn, stream, 50)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the rows written after the sessions ended sent")
    got = await read_stream(stream, at_least=100)
    assert [m["id"] for m in got] == first + after
    assert relay.alive()


# Every stream connection of the shared node ended at once, as a broker restart or a cut does
# (RabbitMQ 3.10's rabbitmqctl closes no stream connection; its reader processes are killed).
KILL_STREAM_CONNECTIONS = (
    "Ps = [P || P <- erlang:processes(), case proc_lib:initial_call(P) of "
    "{rabbit_stream_reader, _, _} -> true; _ -> false end], "
    "[exit(P, kill) || P <- Ps], length(Ps).")


@pytest.mark.alone  # it ends every stream connection of the broker, other tests' too
async def test_streams__connections_ended_by_the_broker_come_back_and_rows_go_once(
    env: Env, stream: str, start_relay
) -> None:
    first = await insert_stream_rows(env.pg_dsn, stream, 50)
    relay = start_relay(streams="true", stream_producers=2, stream_lease_s=3)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the first rows sent")
    killed = (await asyncio.to_thread(
        subprocess.run, ["rabbitmqctl", "eval", KILL_STREAM_CONNECTIONS], check=True,
        capture_output=True, text=True, timeout=60)).stdout
    assert int(killed.strip()) >= 1, killed
    after = await insert_stream_rows(env.pg_dsn, stream, 50)
    await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                     what="the rows written after the broker ended the connections sent")
    got = await read_stream(stream, at_least=100)
    assert sorted(m["id"] for m in got) == sorted(first + after)
    assert relay.alive()
    errors = [e for e in relay.log_events() if e.get("level") == "error"]
    assert not errors, errors[:3]


async def test_streams__a_stream_the_relay_may_not_write_holds_back_no_other_and_goes_once_allowed(
    env: Env, start_relay
) -> None:
    """The relay's broker user may not write to one stream (RabbitMQ refuses its publisher):
    its rows come first in the one slot, the other stream's rows still go, the refusal is said
    once (a warning, no traceback), and the rows go once the user may write there. Before, the
    slot failed at every try (rstream's clean-up replaced the refusal with
    PublisherDoesNotExist), so no row of any stream in that slot went."""
    denied = f"a-denied-{uuid.uuid4().hex[:8]}"  # sorts before the other stream's name
    allowed = f"b-allowed-{uuid.uuid4().hex[:8]}"
    async with a_stream(denied), a_stream(allowed):
        with broker_user("relay_streams", write="^b-allowed-") as (user, password):
            held = await insert_stream_rows(env.pg_dsn, denied, 30)
            others = await insert_stream_rows(env.pg_dsn, allowed, 30)
            url = env.amqp_url.replace("guest:guest", f"{user}:{password}")
            relay = start_relay(streams="true", stream_producers=1, amqp_url=url)
            got_others = await read_stream(allowed, at_least=30)
            assert [m["id"] for m in got_others] == others
            await asyncio.sleep(3.0)  # a few tries go by: said once
            said = [e for e in relay.log_events() if e.get("event") == "stream_missing"]
            assert len(said) == 1, said
            assert "AccessRefused" in said[0]["error"], said
            assert await count_rows(env.pg_dsn, STREAM_TABLE) == 30
            await asyncio.to_thread(rabbitmqctl, "set_permissions", "-p", "/", user, ".*",
                                    ".*", ".*")
            await wait_until(lambda: stream_table_empty(env.pg_dsn), timeout_s=60,
                             what="the held rows sent once the user may write there")
            got = await read_stream(denied, at_least=30)
            assert [m["id"] for m in got] == held
            errors = [e for e in relay.log_events() if e.get("level") == "error"]
            assert not errors, errors[:3]
            assert relay.alive()
