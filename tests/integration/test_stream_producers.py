"""Stream producer names and publishing ids against the real servers (docs/streams.md,
"Producer names" and "What the broker's mark proves"): two outboxes with the default table
name write to one stream and lose nothing; a database that went back (a restore, a failover to
a standby that lagged) sends rows again rather than have the broker drop them as duplicates; a
slot's rows given ids under the old name (before sql/migrations/0022) are settled by that
name's mark."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from relay.pg.queries import Queries, TableNames
from relay.streams.marks import producer_name
from relay.streams.producer import Outgoing, SlotProducer, StreamServer
from tests.helpers import Env, RelayProcess, pg_execute, pg_fetch, pg_fetchval, wait_until
from tests.kit.stream import (
    CREDENTIALS,
    STREAM_HOST,
    STREAM_PORT,
    a_stream,
    insert_stream_rows,
    read_stream,
    stream_table_empty,
)

SERVER = StreamServer(STREAM_HOST, STREAM_PORT, **CREDENTIALS)
QUERIES = Queries(TableNames(None, "queue_message", "queue_message_notify"))


@pytest.fixture
async def stream() -> AsyncIterator[str]:
    async with a_stream(f"relay-test-{uuid.uuid4().hex[:10]}") as name:
        yield name


async def slot_name(dsn: str, slot: int) -> str:
    """The producer name the relay gives `slot` of the outbox in `dsn`."""
    return producer_name("queue_message", await pg_fetchval(dsn, QUERIES["stream_identity"]),
                         slot)


async def drained(dsn: str) -> None:
    await wait_until(lambda: stream_table_empty(dsn), timeout_s=60,
                     what="the stream table emptied")


async def assign_by_hand(dsn: str, stream: str) -> list[dict[str, object]]:
    """What a relay's assignment leaves: every row in slot 0, publishing ids 1..n in row order,
    the slot's last id given n. The rows (id, content, publishing_id) in id order."""
    await pg_execute(dsn, "INSERT INTO queue_message_stream_slots (slot) VALUES (0) "
                     "ON CONFLICT DO NOTHING")
    await pg_execute(
        dsn, "UPDATE queue_message_stream AS t SET slot = 0, publishing_id = o.n "
        "FROM (SELECT id, row_number() OVER (ORDER BY seq) AS n FROM queue_message_stream) o "
        "WHERE t.id = o.id")
    rows = await pg_fetch(dsn, "SELECT id::text, content::text, publishing_id "
                          "FROM queue_message_stream ORDER BY publishing_id")
    await pg_execute(dsn, "INSERT INTO queue_message_stream_seq VALUES (0, $1, $2)",
                     stream, len(rows))
    return [dict(r) for r in rows]


async def send_as(name: str, stream: str, rows: list[Outgoing]) -> int:
    """Send `rows` as producer `name` (a relay of the past); the broker's mark after."""
    producer = SlotProducer(SERVER, name)
    await producer.start()
    try:
        result = await producer.send(stream, rows, timeout_s=20)
        assert len(result.confirmed) == len(rows), result
        return await producer.last_stored(stream)
    finally:
        await producer.close()


def events(relay: RelayProcess, name: str) -> list[dict[str, object]]:
    return [e for e in relay.log_events() if e.get("event") == name]


async def test_stream_producers__two_outboxes_with_the_default_table_name_share_a_stream(
    env: Env, other_db: str, stream: str, start_relay
) -> None:
    """Two services, each with its own `queue_message_stream` (two databases cloned from one
    template: same table names, same table oids), write 1,000 rows each to one stream: the
    stream holds all 2,000, each once (with one name per slot for both, the second outbox's
    were dropped by the broker as duplicates, and confirmed, and deleted)."""
    assert await slot_name(env.pg_dsn, 0) != await slot_name(other_db, 0)
    first = await insert_stream_rows(env.pg_dsn, stream, 1000)
    start_relay(streams="true")
    await drained(env.pg_dsn)
    second = await insert_stream_rows(other_db, stream, 1000)
    start_relay(streams="true", pg_dsn=other_db)
    await drained(other_db)
    got = await read_stream(stream, at_least=2000)
    counts = Counter(m["id"] for m in got)
    assert set(counts) == set(first) | set(second), (
        f"missing {len(set(first) - set(counts))} of the first outbox's rows, "
        f"{len(set(second) - set(counts))} of the second's")
    assert max(counts.values()) == 1


async def test_stream_producers__a_database_set_back_loses_no_row(
    env: Env, stream: str, start_relay
) -> None:
    """1,000 rows drained; the ids given are set back to none, as a restore from before them
    would leave them; the relays start again and 500 more rows come: all 1,500 are in the
    stream (the broker's mark is above every id the database gives again: without asking it,
    the 500 were dropped as duplicates and deleted)."""
    first = await insert_stream_rows(env.pg_dsn, stream, 1000)
    relay = start_relay(streams="true")
    await drained(env.pg_dsn)
    assert relay.terminate() == 0
    await pg_execute(env.pg_dsn, "UPDATE queue_message_stream_seq SET last_id = 0")
    second = await insert_stream_rows(env.pg_dsn, stream, 500)
    start_relay(streams="true")
    await drained(env.pg_dsn)
    got = await read_stream(stream, at_least=1500)
    counts = Counter(m["id"] for m in got)
    assert set(counts) == set(first) | set(second)
    assert max(counts.values()) == 1, "nothing was left with an id: nothing to send twice"


async def test_stream_producers__rows_of_a_restore_whose_fate_is_unknown_are_sent_again(
    env: Env, stream: str, start_relay
) -> None:
    """The database was restored to a moment when 300 rows had ids 1..300 in slot 0 and none
    was sent; afterwards (lost with the restore) the broker stored ids up to 500 for the slot's
    name. Which of the 300 it stored cannot be told from its mark: all 300 go again with new
    ids (each in the stream, counted as sent again), and rows written after the restore go with
    ids above 500."""
    ids = await insert_stream_rows(env.pg_dsn, stream, 300)
    rows = await assign_by_hand(env.pg_dsn, stream)
    name = await slot_name(env.pg_dsn, 0)
    lost = [Outgoing(f"lost-{n}", b"{}", n) for n in range(1, 501)]
    assert await send_as(name, stream, lost) == 500
    assert [r["publishing_id"] for r in rows] == list(range(1, 301))
    relay = start_relay(streams="true", stream_producers=1)
    await drained(env.pg_dsn)
    later = await insert_stream_rows(env.pg_dsn, stream, 20)
    await drained(env.pg_dsn)
    got = await read_stream(stream, at_least=500 + 300 + 20)
    assert [m["id"] for m in got[500:]] == ids + later
    said = events(relay, "stream_mark_ahead_of_database")
    assert [(e["broker_mark"], e["last_given"], e["rows_sent_again"]) for e in said] == [
        (500, 300, 300)]
    assert await pg_fetchval(env.pg_dsn, "SELECT last_id FROM queue_message_stream_seq "
                             "WHERE slot = 0") == 820


async def test_stream_producers__rows_given_ids_under_the_old_name_are_settled_by_its_mark(
    env: Env, stream: str, start_relay
) -> None:
    """Before the upgrade, slot 0 (then named `queue_message-0`) gave 300 rows their ids and its
    owner sent the first 200, which the broker stored, and died. After the upgrade the slot has
    a name of its own: the relay asks the broker for the old name's mark, deletes those 200
    unsent, and sends the other 100 once, under the new name."""
    ids = await insert_stream_rows(env.pg_dsn, stream, 300)
    rows = await assign_by_hand(env.pg_dsn, stream)
    await pg_execute(env.pg_dsn, "INSERT INTO queue_message_stream_legacy VALUES (0, $1, 300)",
                     stream)
    stored = [Outgoing(str(r["id"]), str(r["content"]).encode(), int(str(r["publishing_id"])))
              for r in rows[:200]]
    assert await send_as("queue_message-0", stream, stored) == 200
    relay = start_relay(streams="true", stream_producers=1)
    await drained(env.pg_dsn)
    got = await read_stream(stream, at_least=300)
    assert [m["id"] for m in got] == ids, "the stored 200 not again, the other 100 once"
    said = events(relay, "stream_rows_stored_before")
    assert [(e["producer"], e["last_publishing_id"], e["rows"]) for e in said] == [
        ("queue_message-0", 200, 200)]
    assert await pg_fetchval(env.pg_dsn,
                             "SELECT count(*) FROM queue_message_stream_legacy") == 0


async def test_stream_producers__a_stream_deleted_and_made_again_gets_the_rows_after_it(
    env: Env, start_relay
) -> None:
    """A stream drained, deleted and made again while the relay runs: the new stream has no
    mark, the relay's ids go on above it, and every row written afterwards is in the new
    stream once."""
    name = f"relay-test-{uuid.uuid4().hex[:10]}"
    async with a_stream(name):
        await insert_stream_rows(env.pg_dsn, name, 200)
        start_relay(streams="true", stream_producers=1)
        await drained(env.pg_dsn)
    async with a_stream(name):
        again = await insert_stream_rows(env.pg_dsn, name, 200)
        await drained(env.pg_dsn)
        got = await read_stream(name, at_least=200)
    assert [m["id"] for m in got] == again
