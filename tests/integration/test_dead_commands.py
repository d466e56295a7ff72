"""Dead-letter commands on long and risky operations: snapshots, limits, dry runs, --all."""

from __future__ import annotations

import subprocess

import pytest

from relay.app import database_config
from relay.pg.deadletters import UsageError, admin_action
from relay.settings import Settings
from tests.helpers import RELAY_BIN, Env, count_rows, pg_execute, pg_fetch, pg_session, wait_until
from tests.kit.producer import add_dead_letters, insert_rows

DEAD = "queue_message_dead"


def relay(env: Env, *args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    """Run one `relay` command to completion."""
    return subprocess.run(
        [RELAY_BIN, *args], env=env.relay_env(**settings), capture_output=True, text=True,
        timeout=120, check=False,
    )


async def test_dead_list__says_how_many_of_how_many_it_shows(env: Env) -> None:
    await add_dead_letters(env.pg_dsn, 150, exchange=env.exchange)
    out = relay(env, "dead", "list")
    assert out.returncode == 0, out.stderr
    assert "100 of 150 dead letter(s) (--limit N shows more)" in out.stdout
    assert "20 of 150" in relay(env, "dead", "list", "--limit", "20").stdout
    assert "150 of 150 dead letter(s)\n" in relay(env, "dead", "list", "--limit", "500").stdout


async def test_dead_purge__without_a_filter_asks_for_all_and_deletes_nothing(env: Env) -> None:
    await add_dead_letters(env.pg_dsn, 30, exchange=env.exchange, age="2 days")
    await add_dead_letters(env.pg_dsn, 5, exchange=env.exchange)
    refused = relay(env, "dead", "purge")
    assert refused.returncode == 2
    assert "all 35 dead letter(s): say --all" in refused.stderr
    assert await count_rows(env.pg_dsn, DEAD) == 35
    dry = relay(env, "dead", "purge", "--older-than", "1d", "--dry-run")
    assert "would purge 30 dead letter(s)" in dry.stdout
    assert await count_rows(env.pg_dsn, DEAD) == 35
    limited = relay(env, "dead", "purge", "--older-than", "1d", "--limit", "10",
                    "--batch-rows", "3")
    assert "purged 10 dead letter(s)" in limited.stdout, limited.stderr
    assert await count_rows(env.pg_dsn, DEAD) == 25
    everything = relay(env, "dead", "purge", "--all")
    assert "purged 25 dead letter(s)" in everything.stdout
    assert await count_rows(env.pg_dsn, DEAD) == 0


async def test_dead_replay__dry_run_and_limit_touch_what_they_say(env: Env) -> None:
    await add_dead_letters(env.pg_dsn, 12, exchange=env.exchange)
    assert "would replay 12 " in relay(env, "dead", "replay", "--all", "--dry-run").stdout
    assert await count_rows(env.pg_dsn, DEAD) == 12
    out = relay(env, "dead", "replay", "--all", "--limit", "5", "--batch-rows", "2")
    assert "replayed 5 of 5 dead letter(s)" in out.stdout, out.stderr
    assert (await count_rows(env.pg_dsn, DEAD), await count_rows(env.pg_dsn)) == (7, 5)
    # Off a terminal, progress comes as log events (JSON on stderr), one per step at most.
    assert '"event": "progress"' in out.stderr


async def test_dead_replay_all__ends_while_the_replayed_rows_die_again_at_once(
    env: Env, start_relay
) -> None:
    # The exchange does not exist and a row gets one attempt: every replayed row is dead again
    # within a batch. A replay that re-reads "all dead letters" would chase them forever.
    await add_dead_letters(env.pg_dsn, 200, exchange="no-such-exchange-here")
    start_relay(max_attempts=1, retry_base_s=0.05, retry_max_s=0.05)
    out = relay(env, "dead", "replay", "--all", "--batch-rows", "10")
    assert out.returncode == 0, out.stderr
    assert "replayed 200 of 200 dead letter(s)" in out.stdout

    async def all_dead_again() -> bool:
        return await count_rows(env.pg_dsn, DEAD) == 200 and await count_rows(env.pg_dsn) == 0

    await wait_until(all_dead_again, timeout_s=60, what="the replayed rows dead again")


async def test_dead_letters__a_reused_id_keeps_every_parked_row_and_replay_says_which(
    env: Env, start_relay
) -> None:
    """A producer that reuses an id parked before: `ON CONFLICT (id) DO UPDATE` kept the old
    content and dropped the new row's."""
    missing = "no-such-exchange-reused"
    async with pg_session(env.pg_dsn) as conn:
        [row_id] = await insert_rows(conn, missing, "rk", [{"version": 1}])
        relay_proc = start_relay(max_attempts=1)
        await wait_until(lambda: _dead_rows(env, 1), what="the first row parked")
        await insert_rows(conn, missing, "rk", [{"version": 2}], ids=[row_id])
        await wait_until(lambda: _dead_rows(env, 2), what="the second row parked")
        relay_proc.terminate()
        versions = [r[0] for r in await conn.fetch(
            f"SELECT content->>'version' FROM {DEAD} WHERE id = $1 ORDER BY dead_at", row_id)]
        assert versions == ["1", "2"]
        shown = relay(env, "dead", "show", row_id)
        assert shown.returncode == 0, shown.stderr
        # Latest first; content is the stored JSON text, so its quotes come escaped.
        assert shown.stdout.index('version\\": 2') < shown.stdout.index('version\\": 1')
        out = relay(env, "dead", "replay", row_id)
        assert "replayed 1 of 1 dead letter(s)" in out.stdout, out.stderr
        assert "the latest one was replayed" in out.stdout
        assert await conn.fetchval(
            "SELECT content->>'version' FROM queue_message WHERE id = $1", row_id) == "2"
        assert await conn.fetchval(
            f"SELECT content->>'version' FROM {DEAD} WHERE id = $1", row_id) == "1"


async def _dead_rows(env: Env, n: int) -> bool:
    return await count_rows(env.pg_dsn, DEAD) == n


async def test_dead_purge__deletes_only_the_dead_letters_that_matched_and_reads_reason_literally(
    env: Env,
) -> None:
    """An id parked twice (a producer reused it, or a replayed row died again) has two dead
    letters: purging one reason deleted both, since the purge went by id. And `%` or `_` in
    --reason matched anything."""
    # Hand-written: dead letters sharing an id are the subject.
    await pg_execute(
        env.pg_dsn, f"INSERT INTO {DEAD} (id, seq, exchange, routing_key, content, created_at, "
        "available_at, attempts, reason, dead_at) VALUES "
        "('00000000-0000-4000-8000-000000000001', 1, 'x', 'rk', '{}', now(), now(), 1, "
        "'too_large: content over the limit', now() - interval '2 days'), "
        "('00000000-0000-4000-8000-000000000001', 2, 'x', 'rk', '{}', now(), now(), 1, "
        "'invalid_option: priority 300', now()), "
        "('00000000-0000-4000-8000-000000000002', 3, 'x', 'rk', '{}', now(), now(), 1, "
        "'invalid_row: exchange is NULL', now())")
    wild = relay(env, "dead", "purge", "--reason", "%")
    assert wild.returncode == 0, wild.stderr
    assert "purged 0 dead letter(s)" in wild.stdout
    assert "no dead letters match" in relay(env, "dead", "list", "--reason", "l%r").stdout
    done = relay(env, "dead", "purge", "--reason", "TOO_LARGE")
    assert "purged 1 dead letter(s)" in done.stdout, done.stdout + done.stderr
    left = await pg_fetch(env.pg_dsn, f"SELECT id::text, reason FROM {DEAD} ORDER BY dead_id")
    assert [r["reason"].split(":")[0] for r in left] == ["invalid_option", "invalid_row"]


async def test_dead_reason__a_filter_is_the_reasons_code_exactly_never_a_word_in_its_text(
    env: Env,
) -> None:
    """Purge and replay by reason used to match any letter whose reason *contained* the text:
    purging the 2 `internal` letters also deleted 50 whose text named an exchange
    `x-internal` (52 gone). A reason filter is now the reason's code (the text before ':'),
    exact (any case), in the CLI, the admin API and the page's buttons alike; text with a ':'
    is refused, naming what a filter takes."""
    await add_dead_letters(env.pg_dsn, 2, reason="internal: a bug in the relay's path")
    await add_dead_letters(env.pg_dsn, 50, exchange="x-internal",
                           reason="exchange_not_found: exchange 'x-internal' in vhost '/'")

    listed = relay(env, "dead", "list", "--reason", "internal")
    assert "2 of 2 dead letter(s)" in listed.stdout, listed.stdout + listed.stderr
    dry = relay(env, "dead", "purge", "--reason", "internal", "--dry-run")
    assert "would purge 2 dead letter(s)" in dry.stdout, dry.stdout + dry.stderr
    text = relay(env, "dead", "purge", "--reason", "exchange_not_found: exchange")
    assert text.returncode == 2, text.stderr
    assert "a reason code" in text.stderr
    assert "Traceback" not in text.stderr
    done = relay(env, "dead", "purge", "--reason", "internal")
    assert "purged 2 dead letter(s)" in done.stdout, done.stdout + done.stderr
    left = await pg_fetch(env.pg_dsn, f"SELECT split_part(reason, ':', 1) AS code FROM {DEAD}")
    assert [r["code"] for r in left] == ["exchange_not_found"] * 50

    # The admin API (what the page's buttons call): the same rule.
    db = database_config(Settings(pg_dsn=env.pg_dsn))
    await add_dead_letters(env.pg_dsn, 2, reason="internal: again")
    assert await admin_action(db, "purge", {"reason": "internal", "dry_run": True}) == {"would": 2}
    assert await admin_action(db, "purge", {"reason": "INTERNAL"}) == {"purged": 2}
    assert len(await admin_action(db, "list", {"reason": "exchange_not_found"})) == 50
    with pytest.raises(UsageError, match="a reason code"):
        await admin_action(db, "purge", {"reason": "x-internal: x"})
    assert await count_rows(env.pg_dsn, DEAD) == 50
