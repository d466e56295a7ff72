"""The archive by day (docs/operations.md, "Retention"), against the real servers: `relay
migrate --partition-archive` keeps every archived row (the old archive becomes the first
partition) and makes the coming days' partitions; an archiving relay archives into it and makes
missing partitions itself; `relay prune` drops whole partitions of old days, leaves a partition
only partly old for its turn, and deletes the DEFAULT partition's old rows in batches; `relay
status` lists the partitions with their sizes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import pytest

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
from tests.integration.test_http import http_get, samples
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows

ARCHIVE = "queue_message_archive"


def relay(env: Env, *args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    """Run one `relay` command to completion."""
    return subprocess.run([RELAY_BIN, *args], env=env.relay_env(**settings),
                          capture_output=True, text=True, timeout=120, check=False)


async def _archive_rows(dsn: str, published: list[datetime]) -> None:
    # Hand-written: archived rows of chosen publish times (the relay archives rows dated now).
    await pg_execute(
        dsn, f"INSERT INTO {ARCHIVE} (id, seq, exchange, routing_key, content, created_at, "
        "available_at, attempts, published_at) "
        "SELECT gen_random_uuid(), 1, 'x', 'rk', '{}', p, p, 0, p FROM unnest($1::timestamptz[]) p",
        published)


async def _partitions(dsn: str) -> dict[str, int]:
    """Partition name -> rows, of the archive."""
    rows = await pg_fetch(
        dsn, "SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = $1::regclass", ARCHIVE)
    return {r["name"]: int(await pg_fetchval(dsn, f'SELECT count(*) FROM "{r["name"]}"'))
            for r in rows}


def _day(offset: int) -> datetime:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today + timedelta(days=offset)


async def test_partition_archive__keeps_every_row_and_makes_the_coming_days(env: Env) -> None:
    old = [datetime.now(UTC) - timedelta(days=d, hours=1) for d in range(30)]
    await _archive_rows(env.pg_dsn, old)
    done = relay(env, "migrate", "--partition-archive")
    assert done.returncode == 0, done.stderr
    kind = await pg_fetchval(env.pg_dsn, "SELECT relkind::text FROM pg_class "
                             "WHERE oid = $1::regclass", ARCHIVE)
    assert kind == "p"
    parts = await _partitions(env.pg_dsn)
    assert parts.pop(f"{ARCHIVE}_legacy") == 30, "every archived row is kept"
    assert parts.pop(f"{ARCHIVE}_default") == 0
    # Today and tomorrow are the legacy partition's (up to the day after tomorrow, UTC: the
    # conversion's CHECK held new rows to that bound); the next days up to 7 ahead have theirs.
    assert sorted(parts) == [f"{ARCHIVE}_p{_day(d):%Y%m%d}" for d in range(2, 8)]
    bound = await pg_fetchval(env.pg_dsn, "SELECT pg_get_expr(relpartbound, oid) FROM pg_class "
                              "WHERE relname = $1", f"{ARCHIVE}_legacy")
    assert f"{_day(2):%Y-%m-%d}" in bound, bound
    leftovers = await pg_fetchval(env.pg_dsn, "SELECT count(*) FROM pg_constraint WHERE "
                                  "conrelid = $1::regclass AND contype = 'c'", f"{ARCHIVE}_legacy")
    assert leftovers == 0, "the conversion's CHECK is gone once the partition bound says it"
    assert await count_rows(env.pg_dsn, ARCHIVE) == 30
    again = relay(env, "migrate", "--partition-archive")
    assert again.returncode == 0, again.stderr
    assert await count_rows(env.pg_dsn, ARCHIVE) == 30, "partitioning twice changes nothing"


async def test_partitioned_archive__a_relay_archives_into_it_and_makes_missing_days(
    env: Env, consumer: Consumer, start_relay
) -> None:
    assert relay(env, "migrate", "--partition-archive").returncode == 0
    missing = f"{ARCHIVE}_p{_day(7):%Y%m%d}"
    await pg_execute(env.pg_dsn, f'DROP TABLE "{missing}"')
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                            [{"n": i} for i in range(50)])
    relay_proc = start_relay(on_success="archive")
    await consumer.wait_for(50)
    await wait_until(lambda: _archived(env, 50), what="50 rows archived")
    archived = {r["id"] for r in await pg_fetch(env.pg_dsn, f"SELECT id::text FROM {ARCHIVE}")}
    assert archived == set(ids)
    await wait_until(lambda: _exists(env, missing), what="the relay making the missing partition")
    assert relay_proc.alive()


async def test_partitioned_archive__a_relay_held_off_by_a_reader_says_so_in_a_metric_and_log(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """A reader holds the archive while an archiving relay starts with a coming day missing:
    its CREATE waits at most 100 ms and yields; the relay goes on archiving (into the DEFAULT
    partition), logs the failure and shows it in relay_archive_upkeep_failures."""
    assert relay(env, "migrate", "--partition-archive").returncode == 0
    missing = f"{ARCHIVE}_p{_day(7):%Y%m%d}"
    await pg_execute(env.pg_dsn, f'DROP TABLE "{missing}"')
    port = free_port()
    async with pg_session(env.pg_dsn) as reader, reader.transaction():
        await reader.fetchval(f"SELECT count(*) FROM {ARCHIVE}")  # held until the end
        relay_proc = start_relay(on_success="archive", http_port=port)
        await wait_until(lambda: "archive_partitions_failed" in relay_proc.log_text(),
                         timeout_s=30, what="the relay's log line of a failed upkeep")

        async def failures() -> float | None:
            try:
                _, text = await http_get(port, "/metrics")
            except OSError:
                return None
            return samples(text).get(("relay_archive_upkeep_failures", ()))

        await wait_until(lambda: _equals(failures(), 1.0), timeout_s=30,
                         what="relay_archive_upkeep_failures 1 on /metrics")
        await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"n": i} for i in range(20)])
        await consumer.wait_for(20)
        await wait_until(lambda: _archived(env, 20), what="20 rows archived beside the reader")
    assert not await _exists(env, missing), "made nothing while the reader held the archive"
    assert relay_proc.alive()


async def _equals(value: Awaitable[float | None], wanted: float) -> bool:
    return await value == wanted


async def _archived(env: Env, n: int) -> bool:
    return await count_rows(env.pg_dsn, ARCHIVE) == n


async def _exists(env: Env, name: str) -> bool:
    return bool(await pg_fetchval(env.pg_dsn, "SELECT to_regclass($1) IS NOT NULL", name))


async def test_prune__drops_whole_old_days_leaves_a_partly_old_one_and_trims_default(
    env: Env,
) -> None:
    assert relay(env, "migrate", "--partition-archive").returncode == 0
    # An archive partitioned for a while: days -10 .. -1 have partitions of their own (made
    # here by hand; the legacy partition is gone), day -20 has none (its rows are in DEFAULT).
    await pg_execute(env.pg_dsn, f'DROP TABLE "{ARCHIVE}_legacy"')
    # Today's and tomorrow's partitions: the legacy one covered them; the function makes what
    # is missing.
    assert await pg_fetchval(env.pg_dsn, f"SELECT {ARCHIVE}_partitions(7)") == 2
    for d in range(-10, 0):
        await pg_execute(env.pg_dsn, f'CREATE TABLE "{ARCHIVE}_p{_day(d):%Y%m%d}" PARTITION OF '
                         f"{ARCHIVE} FOR VALUES FROM ('{_day(d).isoformat()}') "
                         f"TO ('{_day(d + 1).isoformat()}')")
        await _archive_rows(env.pg_dsn, [_day(d) + timedelta(hours=h) for h in (1, 12, 23)])
    await _archive_rows(env.pg_dsn, [_day(-20) + timedelta(hours=h) for h in range(5)])
    await _archive_rows(env.pg_dsn, [datetime.now(UTC)])
    done = relay(env, "prune", "--older-than", "7d", "--batch-rows", "2")
    assert done.returncode == 0, done.stderr
    dropped = [f"{ARCHIVE}_p{_day(d):%Y%m%d}" for d in (-10, -9, -8)]
    assert "dropped 3 archive partition(s)" in done.stdout, done.stdout
    assert ", ".join(dropped) in done.stdout
    assert "pruned 5 archived row(s) of the default partition" in done.stdout
    parts = await _partitions(env.pg_dsn)
    assert not set(dropped) & set(parts)
    # Day -7 holds rows older than 7 days and younger ones: left whole for its turn.
    assert parts[f"{ARCHIVE}_p{_day(-7):%Y%m%d}"] == 3
    assert parts[f"{ARCHIVE}_default"] == 0
    assert await count_rows(env.pg_dsn, ARCHIVE) == 7 * 3 + 1


async def test_status__lists_the_archive_partitions_with_their_sizes(env: Env) -> None:
    assert relay(env, "migrate", "--partition-archive").returncode == 0
    out = relay(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    parts = json.loads(out.stdout)["archive_partitions"]
    names = [p["name"] for p in parts]
    assert names[0] == f"{ARCHIVE}_legacy"
    assert names[-1] == f"{ARCHIVE}_default"
    assert all(p["bytes"] > 0 for p in parts)
    text = relay(env, "status")
    assert "archive partitions" in text.stdout
    assert f"{ARCHIVE}_legacy" in text.stdout


async def test_prune__an_archive_that_is_not_partitioned_is_pruned_in_batches(env: Env) -> None:
    await _archive_rows(env.pg_dsn, [datetime.now(UTC) - timedelta(days=d) for d in (1, 8, 9)])
    done = relay(env, "prune", "--older-than", "7d", "--batch-rows", "1")
    assert done.returncode == 0, done.stderr
    assert "pruned 2 archived row(s) published more than 7d ago" in done.stdout
    assert await count_rows(env.pg_dsn, ARCHIVE) == 1


@pytest.mark.timing
async def test_prune__a_reader_of_the_archive_never_holds_its_inserts_and_prune_says_why(
    env: Env,
) -> None:
    """A reader (a pg_dump, a report) holds the archive open: the prune's DROP waits at most
    100 ms for its lock at each try, so archive INSERTs (the settles of archiving relays) never
    queue behind it for long; the prune gives up naming the cause, and drops the day once the
    reader is gone."""
    assert relay(env, "migrate", "--partition-archive").returncode == 0
    old = f"{ARCHIVE}_p{_day(-3):%Y%m%d}"
    await pg_execute(env.pg_dsn, f'DROP TABLE "{ARCHIVE}_legacy"')
    await pg_execute(env.pg_dsn, f'CREATE TABLE "{old}" PARTITION OF {ARCHIVE} FOR VALUES '
                     f"FROM ('{_day(-3).isoformat()}') TO ('{_day(-2).isoformat()}')")
    await _archive_rows(env.pg_dsn, [_day(-3) + timedelta(hours=1)])
    waits: list[float] = []
    async with pg_session(env.pg_dsn) as reader, reader.transaction(), \
            pg_session(env.pg_dsn) as writer:
        await reader.fetchval(f"SELECT count(*) FROM {ARCHIVE}")  # held until the end
        prune = asyncio.ensure_future(
            asyncio.to_thread(relay, env, "prune", "--older-than", "1d"))
        while not prune.done():
            started = time.monotonic()
            await writer.execute(f"INSERT INTO {ARCHIVE} (id, seq, exchange, routing_key, "
                                 "content, created_at, available_at, attempts, published_at) "
                                 "VALUES (gen_random_uuid(), 1, 'x', 'rk', '{}', now(), now(), "
                                 "0, now())")
            waits.append(time.monotonic() - started)
            await asyncio.sleep(0.05)
        refused = await prune
    assert refused.returncode != 0
    assert "another session holds the archive" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(waits) >= 10, "the prune tried for a few seconds"
    # Each DROP waits at most 100 ms for its lock (the INSERT queues behind it meanwhile); the
    # old DROP held every INSERT for the prune's whole run (30 s). 10x headroom over the bound.
    assert max(waits) < 1.0, f"an archive INSERT waited {max(waits):.2f} s"
    print(f"archive INSERTs beside the prune: {len(waits)}, longest {max(waits):.3f} s")
    assert old in await _partitions(env.pg_dsn)
    done = relay(env, "prune", "--older-than", "1d")
    assert done.returncode == 0, done.stderr
    assert old in done.stdout
    assert old not in await _partitions(env.pg_dsn)
