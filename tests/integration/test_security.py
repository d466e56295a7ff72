"""Least-privilege roles, secrets from files, and no password in any output."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.helpers import RELAY_BIN, Env, count_rows, pg_session, wait_until
from tests.integration.test_http import http_get
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows


def as_user(dsn: str, user: str, password: str | None = None) -> str:
    """The same DSN with another user (and password)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    cred = user if password is None else f"{user}:{password}"
    return urlunsplit(parts._replace(netloc=f"{cred}@{host}"))


def relay_cmd(env: Env, *args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    """Run a `relay` sub-command to completion with this test's settings."""
    return subprocess.run(
        [RELAY_BIN, *args], env=env.relay_env(**settings), capture_output=True, text=True,
        timeout=60, check=False,
    )


@dataclass
class Roles:
    """Group roles from sql/roles.sql and one login user in each."""

    producer: str
    relay: str
    producer_login: str
    relay_login: str


@pytest.fixture
async def roles(env: Env) -> AsyncIterator[Roles]:
    """`relay migrate --roles` with names unique to this test; roles dropped at the end."""
    tag = secrets.token_hex(3)
    r = Roles(f"t_producer_{tag}", f"t_relay_{tag}", f"t_app_{tag}", f"t_relayer_{tag}")
    done = relay_cmd(env, "migrate", "--roles", "--producer-role", r.producer,
                     "--relay-role", r.relay)
    assert done.returncode == 0, done.stderr
    async with pg_session(env.pg_dsn) as admin:
        try:
            await admin.execute(f"CREATE ROLE {r.producer_login} LOGIN IN ROLE {r.producer}")
            await admin.execute(f"CREATE ROLE {r.relay_login} LOGIN IN ROLE {r.relay}")
            yield r
        finally:
            # Roles are cluster-wide: drop their grants in this database, then the roles.
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE usename IN ('{r.producer_login}', '{r.relay_login}')"
            )
            for role in (r.producer_login, r.relay_login, r.producer, r.relay):
                await admin.execute(f"DROP OWNED BY {role}")
                await admin.execute(f"DROP ROLE {role}")


async def test_roles__relay_runs_under_its_role_and_producer_may_only_insert(
    env: Env, roles: Roles, consumer: Consumer, start_relay
) -> None:
    async with pg_session(as_user(env.pg_dsn, roles.producer_login)) as producer:
        # Hand-written INSERTs in this file: what each role may write is the subject.
        await producer.executemany(
            "INSERT INTO queue_message (exchange, routing_key, content) VALUES ($1, $2, $3)",
            [(env.exchange, env.routing_key, json.dumps({"n": i})) for i in range(10)],
        )
        for sql in (
            "SELECT count(*) FROM queue_message",
            "DELETE FROM queue_message",
            "UPDATE queue_message SET attempts = 0",
            "SELECT count(*) FROM queue_message_dead",
            "TRUNCATE queue_message",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await producer.execute(sql)

    relay = start_relay(pg_dsn=as_user(env.pg_dsn, roles.relay_login))
    await consumer.wait_for(10)
    await wait_until(lambda: _empty(env), what="outbox drained by the relay role")
    async with pg_session(env.pg_dsn) as admin:
        users = {r[0] for r in await admin.fetch(
            "SELECT usename FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay%' "
                "AND datname = current_database()"
        )}
        async with pg_session(as_user(env.pg_dsn, roles.relay_login)) as relay_conn:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await relay_conn.execute("DROP TABLE queue_message")
    assert users == {roles.relay_login}
    status = relay_cmd(env, "status", "--json", pg_dsn=as_user(env.pg_dsn, roles.relay_login))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["due"] == 0
    assert json.loads(status.stdout)["relays"] == 1  # visible to the relay role itself
    assert relay.terminate() == 0


async def _empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0


async def test_secrets__settings_are_read_from_files_in_the_secrets_dir(
    env: Env, tmp_path: Path
) -> None:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "relay_pg_dsn").write_text(env.pg_dsn + "\n")
    settings = env.relay_env()
    del settings["RELAY_PG_DSN"]
    settings["RELAY_SECRETS_DIR"] = str(folder)
    done = subprocess.run(  # noqa: ASYNC221 - a short CLI call; nothing else runs meanwhile
        [RELAY_BIN, "status", "--json"], env=settings, capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["table"] == "queue_message"


async def test_secrets__no_password_in_logs_errors_status_or_metrics(
    env: Env, consumer: Consumer, start_relay
) -> None:
    password = "pw-" + secrets.token_hex(8)  # trust auth accepts and ignores it
    dsn = as_user(env.pg_dsn, "postgres", password)
    amqp = env.amqp_url  # guest:guest: the shared broker's only user
    amqp_secret = urlsplit(amqp).password or ""
    outputs: list[str] = []

    port = free_port()
    relay = start_relay(pg_dsn=dsn, http_port=port, log_level="debug")

    async def ready() -> bool:
        return (await http_get(port, "/readyz"))[0] == 200

    await wait_until(ready, timeout_s=60, what="/readyz 200")
    for path in ("/metrics", "/readyz", "/healthz"):
        outputs.append((await http_get(port, path))[1])
    for args in (("status",), ("status", "--json")):
        done = relay_cmd(env, *args, pg_dsn=dsn)
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr]
    # Errors: a database that does not exist, a broker port nobody listens on, a bad URL.
    # (A server that does not answer is waited for: a short bound makes the relay give up.)
    failures = [
        relay_cmd(env, "status", pg_dsn=as_user(env.pg_dsn, "postgres", password)
                  .rsplit("/", 1)[0] + "/no_such_db_here"),
        relay_cmd(env, "run", pg_dsn=dsn,
                  amqp_url=f"amqp://guest:{password}@127.0.0.1:{free_port()}/",
                  startup_timeout_s=2),
        relay_cmd(env, "run", pg_dsn=dsn, amqp_url=f"http://guest:{password}@127.0.0.1/"),
        relay_cmd(env, "migrate", pg_dsn=f"host=127.0.0.1 port={free_port()} "
                  f"user=postgres password={password} dbname=x", startup_timeout_s=2),
    ]
    for done in failures:
        assert done.returncode != 0
        assert done.stderr.strip()
        outputs += [done.stdout, done.stderr]
    assert relay.terminate() == 0
    outputs.append(relay.log_text())
    text = "\n".join(outputs)
    assert "relay_started" in text  # the test did read real output
    assert "cannot" in text
    assert password not in text
    assert f":{amqp_secret}@" not in text


async def test_roles__producer_may_insert_only_the_columns_an_application_sets(
    env: Env, roles: Roles
) -> None:
    async with pg_session(as_user(env.pg_dsn, roles.producer_login)) as producer:
        await producer.execute(
            "INSERT INTO queue_message (id, exchange, routing_key, content, options, "
            "ordering_key, available_at) VALUES (gen_random_uuid(), $1, 'rk', '{}', "
            "'{\"priority\": 1}', 'k1', now() + interval '1 hour')", env.exchange)
        await producer.execute(
            "INSERT INTO queue_message (exchange, routing_key, content) VALUES ($1, 'rk', '{}')",
            env.exchange)  # the classic INSERT
        for column, value in (("seq", "9223372036854775000"), ("attempts", "0"),
                              ("created_at", "now()"), ("last_error", "'x'")):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await producer.execute(
                    f"INSERT INTO queue_message (exchange, content, {column}) "
                    f"VALUES ($1, '{{}}', {value})", env.exchange)
        # seq is an identity column: its default needs no USAGE on the sequence.
        usage = await producer.fetchval(
            "SELECT has_sequence_privilege(pg_get_serial_sequence('queue_message', 'seq'), "
            "'USAGE')")
        assert usage is False
    assert await count_rows(env.pg_dsn) == 2


async def test_roles__relay_role_cannot_insert_yet_replays_through_the_definer_function(
    env: Env, roles: Roles
) -> None:
    relay_dsn = as_user(env.pg_dsn, roles.relay_login)
    async with pg_session(env.pg_dsn) as admin:
        await admin.execute(
            "INSERT INTO queue_message_dead (id, seq, exchange, routing_key, content, "
            "created_at, available_at, attempts, reason) VALUES (gen_random_uuid(), 1, $1, "
            "'rk', '{}', now(), now(), 3, 'exchange_not_found')", env.exchange)
    async with (pg_session(relay_dsn) as relay_conn,
                pg_session(as_user(env.pg_dsn, roles.producer_login)) as producer):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await relay_conn.execute(
                "INSERT INTO queue_message (exchange, content) VALUES ('x', '{}')")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # not PUBLIC's to call
            await producer.execute("SELECT queue_message_replay(ARRAY[]::uuid[])")
    done = relay_cmd(env, "dead", "replay", "--all", pg_dsn=relay_dsn)
    assert done.returncode == 0, done.stderr
    assert "replayed 1 of 1" in done.stdout
    assert await count_rows(env.pg_dsn) == 1
    assert await count_rows(env.pg_dsn, "queue_message_dead") == 0


async def test_roles__relay_login_cannot_forge_a_message_yet_parks_and_replays(
    env: Env, roles: Roles, start_relay
) -> None:
    """The relay login could INSERT a dead letter of its own making and replay it into the
    outbox (a forged message), and UPDATE any outbox column (content, exchange)."""
    good = await _admin_insert(env, "no-such-exchange-" + roles.relay)
    relay_dsn = as_user(env.pg_dsn, roles.relay_login)
    async with pg_session(relay_dsn) as relay_conn:
        for sql in (
            "INSERT INTO queue_message_dead (id, exchange, routing_key, content, created_at, "
            "available_at, attempts, reason) VALUES (gen_random_uuid(), 'x', 'rk', '{}', now(), "
            "now(), 0, 'forged')",
            "UPDATE queue_message_dead SET content = '{\"forged\": 1}'",
            "UPDATE queue_message SET content = '{\"forged\": 1}'",
            "UPDATE queue_message SET exchange = 'elsewhere'",
            "UPDATE queue_message SET options = '{}'",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await relay_conn.execute(sql)
        # What the relay does write stays allowed.
        await relay_conn.execute("UPDATE queue_message SET attempts = 0, last_error = NULL, "
                                 "available_at = now()")
    # The relay parks the row under its role (through the definer function)...
    relay = start_relay(pg_dsn=relay_dsn, max_attempts=1)
    await wait_until(lambda: _dead_count(env, 1), what="the row parked by the relay role")
    assert await count_rows(env.pg_dsn) == 0
    assert relay.terminate() == 0
    # ...and replays it: the row is back with its content.
    done = relay_cmd(env, "dead", "replay", "--all", pg_dsn=relay_dsn)
    assert done.returncode == 0, done.stderr
    async with pg_session(env.pg_dsn) as admin:
        assert await admin.fetchval("SELECT content->>'n' FROM queue_message WHERE id = $1",
                                    good) == "1"


async def _admin_insert(env: Env, exchange: str) -> str:
    [row_id] = await insert_rows(env.pg_dsn, exchange, "rk", [{"n": 1}])
    return row_id


async def _dead_count(env: Env, n: int) -> bool:
    return await count_rows(env.pg_dsn, "queue_message_dead") == n


async def test_roles__stream_rows_by_the_producer_role_sent_by_the_relay_role(
    env: Env, roles: Roles, start_relay
) -> None:
    """The stream table (docs/streams.md) under the same roles: a producer inserts a stream and
    a content and nothing else; the relay role gives slots and ids, sends and deletes, parks a
    row too large for a frame and replays it, through definer functions only: it can write
    neither a stream row nor a parked one of its own making."""
    from tests.kit.stream import a_stream, read_stream

    async with a_stream(f"relay-test-{secrets.token_hex(5)}") as stream:
        async with pg_session(as_user(env.pg_dsn, roles.producer_login)) as producer:
            # Hand-written INSERTs: what the producer role may write is the subject.
            await producer.executemany(
                "INSERT INTO queue_message_stream (stream, content) VALUES ($1, $2)",
                [(stream, json.dumps({"n": i})) for i in range(10)])
            await producer.execute(
                "INSERT INTO queue_message_stream (stream, content) "
                "VALUES ($1, jsonb_build_object('pad', repeat('x', 1100000)))", stream)
            for sql in ("INSERT INTO queue_message_stream (stream, content, slot, publishing_id)"
                        " VALUES ('s', '{}', 0, 1)",
                        "SELECT count(*) FROM queue_message_stream",
                        "DELETE FROM queue_message_stream",
                        "UPDATE queue_message_stream_slots SET owner = 'me'",
                        "SELECT count(*) FROM queue_message_stream_dead"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await producer.execute(sql)
        port = free_port()
        relay = start_relay(pg_dsn=as_user(env.pg_dsn, roles.relay_login), streams="true",
                            stream_producers=1, http_port=port)
        got = await read_stream(stream, at_least=10)
        assert sorted(json.loads(m["body"])["n"] for m in got) == list(range(10))
        await wait_until(lambda: _stream_empty(env), what="stream rows deleted by the relay role")
        assert await count_rows(env.pg_dsn, "queue_message_stream_dead") == 1

        async def metric_read() -> bool:  # the relay role reads both tables for its metrics
            return "\nrelay_stream_dead_rows 1.0" in (await http_get(port, "/metrics"))[1]

        await wait_until(metric_read, timeout_s=30, what="relay_stream_dead_rows 1 in /metrics")
        assert relay.terminate() == 0
    async with pg_session(as_user(env.pg_dsn, roles.relay_login)) as relay_role:
        for sql in ("INSERT INTO queue_message_stream (stream, content) VALUES ('s', '{}')",
                    "INSERT INTO queue_message_stream_dead (id, stream, content, created_at, "
                    "reason) VALUES (gen_random_uuid(), 's', '{}', now(), 'forged')",
                    "UPDATE queue_message_stream_dead SET content = '{}'"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await relay_role.execute(sql)
    async with pg_session(as_user(env.pg_dsn, roles.producer_login)) as producer:
        for sql in ("SELECT queue_message_stream_replay(NULL, NULL)",
                    "SELECT queue_message_stream_park(ARRAY[gen_random_uuid()], 'r')"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await producer.execute(sql)
    replayed = relay_cmd(env, "dead", "replay", "--streams", "--all",
                         pg_dsn=as_user(env.pg_dsn, roles.relay_login))
    assert replayed.returncode == 0, replayed.stderr
    assert "moved 1 parked stream row(s) back" in replayed.stdout
    assert await count_rows(env.pg_dsn, "queue_message_stream_dead") == 0
    assert await count_rows(env.pg_dsn, "queue_message_stream") == 1


async def _stream_empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn, "queue_message_stream") == 0


async def test_roles__an_upgrade_grants_new_tables_and_columns_to_the_relay_role_it_finds(
    env: Env, roles: Roles
) -> None:
    """A deployment whose roles were made by an older `relay migrate --roles` upgrades with a
    plain `relay migrate`: the stream table of the old producer names, the occurrence
    column, the function that analyzes the table and the claims' shared frontier are granted
    to the role that holds their neighbours' grants (whatever its name), so its relays need no
    new grant to start."""
    async with pg_session(env.pg_dsn) as admin:
        await admin.execute(f"REVOKE ALL ON queue_message_stream_legacy FROM {roles.relay}")
        await admin.execute(f"REVOKE UPDATE (occurrence_at) ON queue_message FROM {roles.relay}")
        await admin.execute("DROP FUNCTION queue_message_analyze(bigint)")
        await admin.execute("DROP SEQUENCE queue_message_fill_frontier")
        await admin.execute("DELETE FROM relay_migrations WHERE version IN "
                            "('0022_stream_producer_names', '0023_occurrence_kept', "
                            "'0025_statistics_refresh', '0027_shared_fill_frontier')")
    done = relay_cmd(env, "migrate")
    assert done.returncode == 0, done.stderr
    assert "0022_stream_producer_names" in done.stdout
    assert "0023_occurrence_kept" in done.stdout
    assert "0025_statistics_refresh" in done.stdout
    assert "0027_shared_fill_frontier" in done.stdout
    async with pg_session(as_user(env.pg_dsn, roles.relay_login)) as relay:
        assert await relay.fetchval(
            "SELECT has_table_privilege('queue_message_stream_legacy', 'SELECT, DELETE') "
            "AND has_column_privilege('queue_message', 'occurrence_at', 'UPDATE') "
            "AND has_sequence_privilege('queue_message_fill_frontier', 'SELECT, UPDATE')")
        # it may have the table it does not own analyzed (the function runs as the owner)
        assert await relay.fetchval("SELECT queue_message_analyze(1)") is True
    async with pg_session(as_user(env.pg_dsn, roles.producer_login)) as producer:
        assert not await producer.fetchval(
            "SELECT has_table_privilege('queue_message_stream_legacy', 'SELECT') "
            "OR has_column_privilege('queue_message', 'occurrence_at', 'UPDATE') "
            "OR has_function_privilege('queue_message_analyze(bigint)', 'EXECUTE') "
            "OR has_sequence_privilege('queue_message_fill_frontier', 'UPDATE')")
