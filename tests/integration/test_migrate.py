"""`relay migrate` on every deploy: the notify mode stays, --check and --dry-run change
nothing, and `relay run` refuses a schema older than it needs."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from tests.helpers import RELAY_BIN, Env, pg_execute, pg_fetchval, pg_session, wait_until


def _env(pg_dsn: str, amqp_url: str) -> Env:
    return Env(pg_dsn=pg_dsn, amqp_url=amqp_url, exchange="unused", queue="unused")


def relay(env: Env, *args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    """Run one `relay` command to completion."""
    return subprocess.run(
        [RELAY_BIN, *args], env=env.relay_env(**settings), capture_output=True, text=True,
        timeout=60, check=False,
    )


async def _installed_mode(dsn: str) -> str:
    return str(await pg_fetchval(
        dsn, "SELECT COALESCE((SELECT substring(obj_description(t.oid, 'pg_trigger') "
        "FROM 'notify mode: (\\w+)') FROM pg_trigger t "
        "WHERE t.tgname = 'queue_message_notify'), 'off')"))


async def test_migrate__keeps_the_installed_notify_mode_unless_relay_notify_is_given(
    empty_db: str, amqp_url: str
) -> None:
    env = _env(empty_db, amqp_url)
    first = relay(env, "migrate", notify="off")
    assert first.returncode == 0, first.stderr
    assert await _installed_mode(empty_db) == "off"
    routine = relay(env, "migrate")  # what every rollout's migrate Job runs
    assert routine.returncode == 0, routine.stderr
    assert "already up to date (notify trigger: off, kept)" in routine.stdout
    assert await _installed_mode(empty_db) == "off"
    explicit = relay(env, "migrate", notify="always")
    assert explicit.returncode == 0, explicit.stderr
    assert await _installed_mode(empty_db) == "always"
    assert relay(env, "migrate").returncode == 0
    assert await _installed_mode(empty_db) == "always"


async def test_migrate__a_new_table_gets_the_conditional_mode_by_default(
    empty_db: str, amqp_url: str
) -> None:
    done = relay(_env(empty_db, amqp_url), "migrate")
    assert done.returncode == 0, done.stderr
    assert await _installed_mode(empty_db) == "conditional"


async def test_migrate_check__exits_1_while_pending_and_0_once_applied(
    empty_db: str, amqp_url: str
) -> None:
    env = _env(empty_db, amqp_url)
    check = relay(env, "migrate", "--check")
    assert check.returncode == 1, check.stderr
    assert "0001_outbox" in check.stdout
    dry = relay(env, "migrate", "--dry-run", "--roles")
    assert dry.returncode == 0, dry.stderr
    assert "0001_outbox" in dry.stdout
    assert "would grant" in dry.stdout
    async with pg_session(empty_db) as conn:  # neither changed anything
        assert await conn.fetchval("SELECT to_regclass('queue_message')") is None
        assert await conn.fetchval("SELECT to_regclass('relay_migrations')") is None
    assert relay(env, "migrate").returncode == 0
    after = relay(env, "migrate", "--check")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "none pending" in after.stdout
    # Asking for another mode is pending work too.
    assert relay(env, "migrate", "--check", notify="off").returncode == 1


async def test_run__refuses_a_schema_older_than_it_needs_and_names_the_fix(
    db: str, amqp_url: str
) -> None:
    async with pg_session(db) as conn:
        latest = await conn.fetchval("SELECT max(version) FROM relay_migrations")
        await conn.execute("DELETE FROM relay_migrations WHERE version = $1", latest)
    env = _env(db, amqp_url)
    for command in ("run", "status"):
        done = relay(env, command)
        assert done.returncode == 2, done.stdout + done.stderr
        assert latest in done.stderr
        assert "run `relay migrate`" in done.stderr
        assert "Traceback" not in done.stderr
    assert relay(env, "migrate").returncode == 0
    assert relay(env, "status").returncode == 0


async def test_migrate__schema_history_follows_the_table_not_the_spelling_of_relay_table(
    empty_db: str, amqp_url: str
) -> None:
    env = _env(empty_db, amqp_url)
    assert relay(env, "migrate").returncode == 0
    qualified = relay(env, "migrate", "--check", table="public.queue_message")
    assert qualified.returncode == 0, qualified.stdout + qualified.stderr
    assert "none pending" in qualified.stdout


async def test_migrate_check_wait__ends_0_once_another_process_migrated(
    empty_db: str, amqp_url: str
) -> None:
    env = _env(empty_db, amqp_url)
    waiting = subprocess.Popen(  # noqa: ASYNC220 - the init container of a rollout
        [RELAY_BIN, "migrate", "--check", "--wait-s", "60"], env=env.relay_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert waiting.poll() is None
        assert relay(env, "migrate").returncode == 0  # the migrate Job
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert "none pending" in out
    # Without a migrate, it gives up with 1 once the wait is over.
    assert relay(env, "migrate", "--check", "--wait-s", "0.5", notify="off").returncode == 1


async def test_migrate_roles__a_bad_role_name_stops_it_before_anything_is_applied(
    empty_db: str, amqp_url: str
) -> None:
    done = relay(_env(empty_db, amqp_url), "migrate", "--roles", "--producer-role", "bad name")
    assert done.returncode == 2
    assert "role name 'bad name'" in done.stderr
    assert await pg_fetchval(empty_db, "SELECT to_regclass('queue_message')") is None


async def _insert(env: Env) -> float:
    """Seconds a producer's one-row INSERT took to commit (at most 30: a test failure)."""
    started = time.monotonic()
    # Hand-written: the classic INSERT of an application, columns and all, is the subject.
    await asyncio.wait_for(pg_execute(
        env.pg_dsn, "INSERT INTO queue_message (exchange, routing_key, content) "
        "VALUES ('x', 'rk', '{}')"), timeout=30)
    return time.monotonic() - started


WAITING = ("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted "
           "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))")


@pytest.mark.parametrize("notify", [None, "always"])
async def test_migrate__a_reader_of_the_outbox_never_locks_producers_out(
    empty_db: str, amqp_url: str, notify: str | None
) -> None:
    """A reader transaction on the outbox (a report, pg_dump, a relay batch) and a routine
    `relay migrate` on deploy: the migrate's lock request queued behind the reader, and every
    producer's INSERT behind it: one waited 9.5 s, until the reader ended. With nothing to
    change it takes no lock and finishes while the reader reads; with a change it waits with a
    short lock_timeout and retries, and a producer's INSERT made while it waits commits while
    the reader still reads (the order is the proof: the reader ends only after it)."""
    env = _env(empty_db, amqp_url)
    assert relay(env, "migrate", notify="conditional").returncode == 0
    settings = {} if notify is None else {"notify": notify}
    async with pg_session(empty_db) as reader:
        await reader.execute("BEGIN")
        await reader.fetchval("SELECT count(*) FROM queue_message")
        migrating = asyncio.ensure_future(asyncio.to_thread(relay, env, "migrate", **settings))
        if notify is None:
            # Nothing to change: done while the reader still reads, no lock taken.
            await asyncio.wait_for(asyncio.shield(migrating), timeout=60)
            took = await _insert(env)
        else:
            await wait_until(lambda: _waits(empty_db), timeout_s=60, interval_s=0.02,
                             what="relay migrate waiting for the outbox's lock behind the reader")
            took = await _insert(env)
            assert not migrating.done(), "migrate changed the trigger under an open reader"
        await reader.execute("ROLLBACK")
    done = await asyncio.wait_for(migrating, timeout=60)
    assert done.returncode == 0, done.stderr
    print(f"a producer's INSERT took {took:.2f} s while relay migrate ran")
    assert await _installed_mode(empty_db) == (notify or "conditional")
    if notify is None:
        assert "already up to date" in done.stdout
    else:
        # The INSERT committed past the migrate's queued lock request: that request had timed
        # out, which the migrate says.
        assert "migration_waiting_for_lock" in done.stdout + done.stderr


async def _waits(dsn: str) -> bool:
    return bool(await pg_fetchval(dsn, WAITING))


async def test_migrate__an_outbox_locked_past_the_wait_stops_it_naming_the_holder(
    empty_db: str, amqp_url: str
) -> None:
    env = _env(empty_db, amqp_url)
    assert relay(env, "migrate", notify="conditional").returncode == 0
    async with pg_session(empty_db) as reader:
        await reader.execute("BEGIN")
        await reader.fetchval("SELECT count(*) FROM queue_message")
        pid = await reader.fetchval("SELECT pg_backend_pid()")
        done = await asyncio.to_thread(relay, env, "migrate", "--lock-wait-s", "1",
                                       notify="always")
        await reader.execute("ROLLBACK")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "stayed locked by other sessions" in done.stderr
    assert f"pid {pid} " in done.stderr
    assert "Traceback" not in done.stderr
    assert await _installed_mode(empty_db) == "conditional"


async def test_migrate__an_index_an_interrupted_concurrent_build_left_invalid_is_built_again(
    empty_db: str, amqp_url: str
) -> None:
    """New indexes on the outbox build CONCURRENTLY, after their migration's transaction: a
    build cut short leaves an invalid index and the version unrecorded; the next migrate
    drops that index, builds it again and records the version."""
    env = _env(empty_db, amqp_url)
    assert relay(env, "migrate").returncode == 0
    await pg_execute(empty_db, "DELETE FROM relay_migrations WHERE version = '0011_fair_claims'")
    await pg_execute(empty_db, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                     "'queue_message_unkeyed_xact_idx'::regclass")
    check = relay(env, "migrate", "--check")
    assert check.returncode == 1, check.stdout
    again = relay(env, "migrate")
    assert again.returncode == 0, again.stderr
    assert "0011_fair_claims" in again.stdout
    assert await pg_fetchval(empty_db, "SELECT indisvalid FROM pg_index WHERE indexrelid = "
                             "'queue_message_unkeyed_xact_idx'::regclass") is True
    assert relay(env, "migrate", "--check").returncode == 0
