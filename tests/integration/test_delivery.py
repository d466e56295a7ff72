"""End to end with real `relay run` processes: rows inserted with the classic INSERT reach a
consumer once, with message_id = row id, whatever the wake-up path."""

from __future__ import annotations

import asyncio
import json
import random

import asyncpg

from relay.pg.migrate import migration_files
from relay.pg.queries import Queries, TableNames
from relay.settings import Settings
from tests.helpers import Env, count_rows, pg_session, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows

CLASSIC_SCHEMA = """
CREATE TABLE queue_message (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    exchange text, routing_key text, content jsonb, options jsonb
);
CREATE FUNCTION queue_message_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('queue_message_notify', NEW.id::text); RETURN NEW; END $$;
CREATE TRIGGER do_notify AFTER INSERT ON queue_message
    FOR EACH ROW EXECUTE FUNCTION queue_message_notify();
"""


async def _table_empty(dsn: str) -> bool:
    return await count_rows(dsn) == 0


async def test_startup_sweep__delivers_rows_inserted_while_no_relay_ran(
    env: Env, consumer: Consumer, start_relay
) -> None:
    bodies = [{"n": i} for i in range(50)]
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, bodies)
    relay = start_relay(poll_interval_s=60)
    await consumer.wait_for(50)
    assert sorted(consumer.ids) == sorted(ids)
    await wait_until(lambda: _table_empty(env.pg_dsn), what="an empty outbox")
    assert relay.terminate() == 0


async def test_migrate__upgrades_classic_table_in_place_and_relay_delivers_old_and_new_rows(
    empty_db: str, env: Env, consumer: Consumer, start_relay, tmp_path
) -> None:
    env.pg_dsn = empty_db
    async with pg_session(empty_db) as conn:
        await conn.execute(CLASSIC_SCHEMA)
        old_ids = [
            r[0]
            # Hand-written: the classic schema's own columns are the subject.
            for r in await conn.fetch(
                "INSERT INTO queue_message (exchange, routing_key, content, options) "
                "SELECT $1, 'rk', jsonb_build_object('old', g), NULL "
                "FROM generate_series(1, 500) g RETURNING id::text",
                env.exchange,
            )
        ]

    from tests.helpers import RelayProcess

    migrate = RelayProcess(env.relay_env(), tmp_path / "migrate.log", command="migrate").start()
    assert migrate.proc is not None
    assert migrate.proc.wait(timeout=60) == 0, migrate.log_text()

    async with pg_session(empty_db) as conn:
        triggers = await conn.fetch(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'queue_message'::regclass "
            "AND NOT tgisinternal"
        )
        assert [t["tgname"] for t in triggers] == ["queue_message_notify"]
        assert await conn.fetchval("SELECT count(*) FROM queue_message") == 500
        assert await conn.fetchval("SELECT count(DISTINCT seq) FROM queue_message") == 500

    relay = start_relay(poll_interval_s=60)
    await consumer.wait_for(500)
    new_ids = await insert_rows(env.pg_dsn, env.exchange, "rk", [{"new": i} for i in range(20)])
    await consumer.wait_for(520)
    assert sorted(consumer.ids) == sorted(old_ids + new_ids)
    assert consumer.duplicates() == 0
    await wait_until(lambda: _table_empty(env.pg_dsn), what="an empty outbox")
    assert relay.terminate() == 0


async def test_migrate__concurrent_runs_are_safe_and_idempotent(empty_db: str, env: Env,
                                                                tmp_path) -> None:
    from tests.helpers import RelayProcess

    env.pg_dsn = empty_db
    runs = [
        RelayProcess(env.relay_env(), tmp_path / f"m{i}.log", command="migrate").start()
        for i in range(3)
    ]
    codes = [r.proc.wait(timeout=60) for r in runs if r.proc is not None]
    assert codes == [0, 0, 0], [r.log_text() for r in runs]
    texts = [r.log_text() for r in runs]
    assert sum("already up to date" in t for t in texts) == 2
    async with pg_session(empty_db) as conn:
        applied = await conn.fetchval("SELECT count(*) FROM relay_migrations")
        assert applied == len(migration_files())


async def test_replicas__three_relays_and_four_producers_deliver_every_row_exactly_once(
    env: Env, consumer: Consumer, start_relay
) -> None:
    total, producers = 20_000, 4
    relays = [start_relay(batch_size=200) for _ in range(3)]

    async def produce(worker: int) -> list[str]:
        async with pg_session(env.pg_dsn) as conn:
            ids: list[str] = []
            rng = random.Random(worker)
            per = total // producers
            sent = 0
            while sent < per:
                n = min(rng.randint(1, 40), per - sent)
                async with conn.transaction():
                    ids += await insert_rows(
                        conn, env.exchange, "rk",
                        ({"p": worker, "i": g} for g in range(sent, sent + n)))
                sent += n
                await asyncio.sleep(rng.uniform(0, 0.01))
        return ids

    produced = await asyncio.gather(*(produce(w) for w in range(producers)))
    all_ids = [i for ids in produced for i in ids]
    assert len(all_ids) == total
    await consumer.wait_for(total, timeout_s=180)
    await wait_until(lambda: _table_empty(env.pg_dsn), timeout_s=60, what="an empty outbox")
    await asyncio.sleep(0.5)  # let any straggling duplicate arrive before counting
    assert sorted(set(consumer.ids)) == sorted(all_ids)
    # At-least-once: a duplicate needs a batch lost between ack and commit, which only a fault
    # causes (logged by the relay), and is bounded by the rows in flight.
    faults = [e["event"] for r in relays for e in r.log_events() if e.get("level") != "info"]
    in_flight = 200 * Settings.model_fields["concurrency"].default * len(relays)
    print(f"\nreplicas: duplicates={consumer.duplicates()} relay warnings/errors={faults}")
    assert consumer.duplicates() == 0 or faults, "a duplicate with no fault logged"
    assert consumer.duplicates() <= in_flight
    assert [r.terminate() for r in relays] == [0, 0, 0]


async def _listener_backend(conn: asyncpg.Connection) -> asyncpg.Record | None:
    """The relay's LISTEN session once it listens (its LISTEN done: the last statement it ran
    is that or its ping). A session still starting is not it yet: ended then, the relay's
    attempt fails and is tried again, which is not the loss of a listening session."""
    return await conn.fetchrow(
        "SELECT pid, backend_start FROM pg_stat_activity "
        "WHERE application_name LIKE 'outbox-relay listener%' AND datname = current_database() "
        "AND state = 'idle' AND (query ILIKE 'LISTEN %' OR query = $1)", PING)


PING = Queries(TableNames(None, "queue_message", "queue_message_notify"))["ping"]


async def test_lost_notification__rows_committed_while_listen_connection_is_down_are_delivered(
    env: Env, consumer: Consumer, start_relay
) -> None:
    relay = start_relay(poll_interval_s=120)
    async with pg_session(env.pg_dsn) as admin:
        await wait_until(lambda: _listener_backend(admin), what="the relay's LISTEN connection")
        expected: list[str] = []
        # Commit while the LISTEN backend is gone; repeat until the commit provably happened
        # before the relay's new LISTEN connection started (so the NOTIFY was lost to it).
        for attempt in range(5):
            before = await _listener_backend(admin)
            assert before is not None
            async with admin.transaction():
                rows = await insert_rows(admin, env.exchange, "rk",
                                         ({"attempt": attempt, "i": g} for g in range(1, 11)))
                await admin.execute("SELECT pg_terminate_backend($1)", before["pid"])
                committed_at = await admin.fetchval("SELECT clock_timestamp()")
            expected.extend(rows)
            await consumer.wait_for(len(expected), timeout_s=30)
            after = await _listener_backend(admin)
            assert after is not None
            assert after["pid"] != before["pid"]
            if after["backend_start"] > committed_at:
                break
        else:
            raise AssertionError("could not commit inside the LISTEN outage in 5 attempts")
    assert sorted(set(consumer.ids)) == sorted(expected)
    lost = [e for e in relay.log_events()
            if e.get("event") == "connection_lost" and e.get("connection") == "listener"]
    assert lost, "the relay did not notice its LISTEN connection was terminated"
    assert relay.terminate() == 0


async def test_options__amqplib_and_snake_case_names_arrive_as_amqp_properties(
    env: Env, consumer: Consumer, start_relay
) -> None:
    camel = {
        "contentType": "application/vnd.test+json",
        "contentEncoding": "identity",
        "persistent": False,
        "headers": {"tenant": "t1", "n": 7},
        "priority": 5,
        "correlationId": "corr-1",
        "replyTo": "replies",
        "expiration": 60000,
        "timestamp": 1_700_000_000,
        "type": "order.created",
        "appId": "shop",
        "userId": "guest",
    }
    snake = {
        "content_type": "text/plain",
        "delivery_mode": 2,
        "correlation_id": "corr-2",
        "reply_to": "r2",
        "expiration": "5000",
        "app_id": "billing",
        "type": "invoice.paid",
    }
    [camel_id] = await insert_rows(env.pg_dsn, env.exchange, "rk", [{"k": 1}], options=camel)
    [snake_id] = await insert_rows(env.pg_dsn, env.exchange, "rk", [{"k": 2}], options=snake)
    [plain_id] = await insert_rows(env.pg_dsn, env.exchange, "rk", [{"k": 3}])
    relay = start_relay()
    await consumer.wait_for(3)
    by_id = {str(m.message_id): m for m in consumer.messages}
    c, s, p = by_id[camel_id], by_id[snake_id], by_id[plain_id]
    assert (c.content_type, c.content_encoding, c.delivery_mode.value) == (
        "application/vnd.test+json", "identity", 1)
    assert c.headers == {"tenant": "t1", "n": 7, "x-outbox-id": camel_id}
    assert (c.priority, c.correlation_id, c.reply_to, c.expiration) == (5, "corr-1", "replies", 60)
    assert c.timestamp is not None
    assert int(c.timestamp.timestamp()) == 1_700_000_000
    assert (c.type, c.app_id, c.user_id) == ("order.created", "shop", "guest")
    assert (s.content_type, s.delivery_mode.value, s.correlation_id) == ("text/plain", 2, "corr-2")
    assert (s.reply_to, s.expiration, s.app_id, s.type) == ("r2", 5, "billing", "invoice.paid")
    assert (p.content_type, p.delivery_mode.value) == ("application/json", 2)
    assert json.loads(p.body) == {"k": 3}
    assert relay.terminate() == 0


async def test_body__is_the_stored_json_text_byte_for_byte(
    env: Env, consumer: Consumer, start_relay
) -> None:
    async with pg_session(env.pg_dsn) as conn:
        # Hand-written: the JSON text as the producer wrote it (12.50, not 12.5) is the subject.
        row_id = await conn.fetchval(
            "INSERT INTO queue_message (exchange, routing_key, content) "
            "VALUES ($1, 'rk', $2::jsonb) RETURNING id::text",
            env.exchange, '{"amount": 12.50, "name": "Zoë ✓", "nested": {"a": [1, 2]}}',
        )
        stored = await conn.fetchval("SELECT content::text FROM queue_message")
    relay = start_relay()
    await consumer.wait_for(1)
    assert consumer.messages[0].message_id == row_id
    assert consumer.messages[0].body == stored.encode()
    assert relay.terminate() == 0
