"""Retention of a large archive: `relay prune --older-than 7d` on an archive that is not
partitioned (batched DELETE) beside the same rows in an archive partitioned by day (whole days
dropped), on a private cluster with the server's defaults (bench/common.py).

    python -m bench --scenario prune -- [--rows 1000000] [--runs 1]

The rows are spread evenly over the last 14 days, so half are older than the cutoff. For each
archive: the seconds `relay prune` took, the WAL it wrote (pg_current_wal_lsn before and after),
the dead tuples it left for vacuum, and the archive's size before and after. Writes its
block of bench/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from bench.common import (
    RELAY_BIN,
    BenchEnv,
    OneOff,
    create_env,
    drop_env,
    one_off,
    run_on_private_server,
    wait_quiet,
)

ARCHIVE = "queue_message_archive"
DAYS = 14


def _day(offset: int) -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) \
        + timedelta(days=offset)


def _relay(env: BenchEnv, *args: str) -> str:
    out = subprocess.run([RELAY_BIN, *args], env=env.relay_env(), capture_output=True,
                         text=True, timeout=3600, check=True)
    return out.stdout.strip()


async def _fill(env: BenchEnv, rows: int, partitioned: bool) -> None:
    """`rows` archived rows, published evenly over the last DAYS days."""
    conn = await asyncpg.connect(env.dsn)
    try:
        if partitioned:
            _relay(env, "migrate", "--partition-archive")
            # An archive partitioned for two weeks: a partition per day, no legacy rows.
            await conn.execute(f'DROP TABLE "{ARCHIVE}_legacy"')
            for d in range(-DAYS, 1):
                await conn.execute(
                    f'CREATE TABLE IF NOT EXISTS "{ARCHIVE}_p{_day(d):%Y%m%d}" PARTITION OF '
                    f"{ARCHIVE} FOR VALUES FROM ('{_day(d).isoformat()}') "
                    f"TO ('{_day(d + 1).isoformat()}')")
        await conn.execute(
            f"INSERT INTO {ARCHIVE} (id, seq, exchange, routing_key, content, created_at, "
            "available_at, attempts, published_at) "
            "SELECT gen_random_uuid(), g, 'x', 'rk', jsonb_build_object('n', g), p, p, 0, p "
            "FROM (SELECT g, now() - make_interval(secs => (g % $2) * 86400.0 / $2 * $3) AS p "
            "      FROM generate_series(1, $1) AS g) AS s",
            rows, rows, float(DAYS))
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def _archive_stats(conn: asyncpg.Connection) -> tuple[int, int]:
    """(dead tuples, bytes) of the archive and its partitions, stats flushed first."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await asyncio.sleep(1.0)  # the collector's view, for this session's next transaction
    row = await conn.fetchrow(
        "SELECT COALESCE(sum(s.n_dead_tup), 0)::bigint AS dead, "
        "       COALESCE(sum(pg_total_relation_size(c.oid)), 0)::bigint AS bytes "
        "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
        "WHERE c.relname = $1 OR c.oid IN (SELECT inhrelid FROM pg_inherits "
        "                                  WHERE inhparent = $1::regclass)", ARCHIVE)
    return int(row["dead"]), int(row["bytes"])


async def prune_once(rows: int, partitioned: bool) -> dict[str, Any]:
    """One archive filled and pruned; its figures."""
    env = await create_env("prune_part" if partitioned else "prune_rows")
    try:
        await _fill(env, rows, partitioned)
        conn = await asyncpg.connect(env.dsn)
        try:
            _, bytes_before = await _archive_stats(conn)
            lsn = await conn.fetchval("SELECT pg_current_wal_lsn()")
            started = time.monotonic()
            said = _relay(env, "prune", "--older-than", "7d")
            seconds = time.monotonic() - started
            wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", lsn)
            dead, bytes_after = await _archive_stats(conn)
            left = await conn.fetchval(f"SELECT count(*) FROM {ARCHIVE}")
        finally:
            await conn.close()
    finally:
        await drop_env(env)
    return {"archive": "partitioned by day" if partitioned else "not partitioned",
            "rows": rows, "rows_left": int(left), "seconds": round(seconds, 2),
            "wal_mb": round(float(wal) / 2**20, 1), "dead_tuples": dead,
            "mb_before": round(bytes_before / 2**20, 1),
            "mb_after": round(bytes_after / 2**20, 1), "relay_said": said.replace("\n", " ")}


async def run(rows: int, runs: int, quiet_below: float) -> list[dict[str, Any]]:
    """Alternate the two archives `runs` times."""
    out = []
    for i in range(runs):
        for partitioned in (False, True):
            await wait_quiet(quiet_below)
            result = await prune_once(rows, partitioned)
            result["run"] = i + 1
            print(result, flush=True)
            out.append(result)
    return out


def report(results: list[dict[str, Any]], run: OneOff) -> str:
    """The Markdown results file."""
    lines = run.header("Retention: prune by DELETE or by dropping days",
                       "server: a private initdb cluster with the server's defaults",
                       f"rows: spread evenly over the last {DAYS} days; "
                       "`relay prune --older-than 7d`")
    lines += ["| archive | run | rows | rows left | seconds | WAL MB | dead tuples | "
              "MB before | MB after |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['archive']} | {r['run']} | {r['rows']:,} | {r['rows_left']:,} | "
              f"{r['seconds']} | {r['wal_mb']} | {r['dead_tuples']:,} | {r['mb_before']} | "
              f"{r['mb_after']} |" for r in results]
    lines += ["", "What `relay prune` said:", ""]
    lines += [f"- {r['archive']}, run {r['run']}: {r['relay_said']}" for r in results]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run_ = one_off("bench.prune", scenario="prune", runs=1,
                         options={"--rows": {"type": int, "default": 1_000_000}})
    results = run_on_private_server(lambda: run(args.rows, args.runs, args.quiet_below))
    run_.write(args.out, report(results, run_))


if __name__ == "__main__":
    main()
