"""Live rows beside a bulk job: one-row transactions committed while a bulk transaction drains.

    python -m bench.fairness --out /tmp/fairness.md [--rows 300000] [--live-rate 200]
        [--relays 1,2] [--runs 1] [--relay-setting EXPRESS_LANE=false] [--insert-cost]
        [--spark] [--before-src DIR]

One run, on a private cluster with the server's defaults, with `relay run` at its defaults
already running and idle (the relays of --relays):
1. alone: a bulk job commits --rows rows in one INSERT ... SELECT; the time until every
   message is in the bulk queue and the outbox is empty gives the bulk's rate alone;
2. beside live rows: the same bulk, and from its commit on an application commits one row per
   transaction at --live-rate (bench/producer.py, Poisson arrivals, its own process) to another
   routing key, bound to a queue this process consumes. Each live row's latency is commit ->
   consumer (CLOCK_MONOTONIC in both processes); only rows committed before the bulk drained
   count. The bulk's rate beside them over its rate alone is the cost of fairness.

The bulk queue is not consumed during the run (as in bench/drain.py); the live queue is.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench.common import (
    AMQP_URL,
    BODY_SQL,
    ROUTING_KEY,
    BenchEnv,
    OneOff,
    Relay,
    builds,
    checkpoint,
    delete_queues,
    insert_backlog,
    load_before,
    one_off,
    one_off_env,
    percentile,
    purge_queue,
    wait_drained,
    wait_quiet,
)
from bench.compare import _revision
from bench.server import run_on_private_server

LIVE_KEY = "live"
LIVE_RATE = 200  # one-row transactions per second, the targets' rate


async def bind_live_queue(env: BenchEnv) -> str:
    queue = env.queue + "-live"
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        q = await ch.declare_queue(queue, durable=True)
        await q.bind(env.exchange, LIVE_KEY)
    finally:
        await amqp.close()
    return queue


class SparkBulk:
    """The bulk written by the project's Spark writer (relay.spark.write_outbox, staged mode:
    Spark writes a staging table, then one INSERT ... SELECT commits every row at once) from a
    local[2] session of this process."""

    def __init__(self) -> None:
        from relay.spark import session

        self.spark = session("bench-fairness", master="local[2]",
                             **{"spark.ui.enabled": "false"})
        self.spark.sparkContext.setLogLevel("ERROR")
        self.writes = 0

    def write(self, env: BenchEnv, rows: int) -> None:
        """Write `rows` rows of about 200 bytes to the scenario's exchange and routing key."""
        from pyspark.sql import functions as F

        from relay.spark import outbox_id, write_outbox

        self.writes += 1
        df = self.spark.range(0, rows, numPartitions=4).select(
            F.lit(env.exchange).alias("exchange"), F.lit(ROUTING_KEY).alias("routing_key"),
            F.struct(F.col("id").alias("n"), F.lit("settlement.completed").alias("type"),
                     F.lit("x" * 120).alias("pad")).alias("content"),
            outbox_id(F.lit(f"w{self.writes}"), F.col("id")).alias("id"))
        write_outbox(df, dsn=env.dsn, mode="staged")


async def _bulk(env: BenchEnv, rows: int, live: Live | None = None,
                spark: SparkBulk | None = None) -> tuple[float, float]:
    """Commit the bulk (and start `live`'s producer at once); (commit time, time drained)."""
    conn = await asyncpg.connect(env.dsn)
    try:
        if spark is None:
            committed = await insert_backlog(conn, env, rows)
        else:
            await asyncio.to_thread(spark.write, env, rows)
            committed = time.monotonic()
        if live is not None:
            await live.start()
        drained = await wait_drained(conn, env, rows, timeout_s=600)
    finally:
        await conn.close()
    return committed, drained


@dataclass
class Live:
    """The application's producer: one row per transaction at `rate`, in its own process
    (bench/producer.py), to the live routing key; each row's id and commit time go to `out`."""

    env: BenchEnv
    rate: int
    seconds: float
    out: Path
    proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start producing."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.producer", "--dsn", self.env.dsn,
            "--exchange", self.env.exchange, "--rate", str(self.rate), "--connections", "1",
            "--seconds", str(self.seconds), "--routing-key", LIVE_KEY, "--out", str(self.out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def committed(self) -> dict[str, float]:
        """Wait for the producer to end; each row's commit time (CLOCK_MONOTONIC), by id."""
        assert self.proc is not None
        _, stderr = await self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"live producer failed: {stderr.decode()[-2000:]}")
        pairs = (line.split() for line in self.out.read_text().splitlines())
        return {row_id: float(t) for row_id, t in pairs}


async def run_once(env: BenchEnv, live_queue: str, rows: int, *, live_rate: int,
                   relays: int, log_dir: Path, settings: dict[str, str],
                   spark: SparkBulk | None = None) -> dict[str, Any]:
    """The bulk alone, then beside live rows, with the same running relays."""
    procs = [Relay(env.relay_env(**settings), log_dir / f"relay-{i}.log")
             for i in range(relays)]
    received: dict[str, float] = {}

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        received.setdefault(str(message.message_id), time.monotonic())

    amqp = await aio_pika.connect(AMQP_URL)
    try:
        for proc in procs:
            await proc.wait_started()
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=1000)
        await (await channel.get_queue(live_queue)).consume(on_message, no_ack=True)

        await checkpoint(env)
        load_alone = load_before()
        start, end = await _bulk(env, rows, spark=spark)
        alone_s = end - start
        await purge_queue(env)

        await checkpoint(env)
        load_mixed = load_before()
        live = Live(env, live_rate, alone_s * 1.5 + 2, log_dir / "live-ids.txt")
        start, end = await _bulk(env, rows, live, spark)
        mixed_s = end - start
        committed = await live.committed()
        deadline = time.monotonic() + 60
        while committed.keys() - received.keys():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(committed.keys() - received.keys())} live rows "
                                   "never arrived")
            await asyncio.sleep(0.05)
    finally:
        for proc in procs:
            proc.stop()
        await amqp.close()
    during = [(received[k] - t) * 1000 for k, t in committed.items() if t <= end]
    # Each live row's commit time (from the bulk's commit) and latency, for reading the tail.
    (log_dir / "live-latencies.txt").write_text("".join(
        f"{t - start:.6f} {(received[k] - t) * 1000:.3f}\n" for k, t in committed.items()))
    received.clear()
    await purge_queue(env)
    return {
        "bulk_rows": rows, "bulk_by": "spark staged" if spark else "INSERT ... SELECT",
        "relays": relays, "live_rate_per_s": live_rate,
        "alone_msg_per_s": round(rows / alone_s, 1),
        "beside_live_msg_per_s": round(rows / mixed_s, 1),
        "drain_ratio": round(alone_s / mixed_s, 3),
        "live_rows_during_drain": len(during),
        "live_p50_ms": round(percentile(during, 50), 2) if during else None,
        "live_p95_ms": round(percentile(during, 95), 2) if during else None,
        "live_p99_ms": round(percentile(during, 99), 2) if during else None,
        "live_max_ms": round(max(during), 2) if during else None,
        "load_before_alone": load_alone, "load_before_beside": load_mixed,
    }


async def insert_cost(env: BenchEnv, rows: int, runs: int) -> list[dict[str, Any]]:
    """What the xact column and its index cost producers: two copies of the outbox (no
    trigger on either), one without them; a `rows`-row INSERT ... SELECT, and 8 connections
    committing one-row INSERTs for 5 s, on each in turn."""
    tables = {"with xact": "bench_with_xact", "without xact": "bench_without_xact"}
    conn = await asyncpg.connect(env.dsn)
    out = []
    try:
        for table in tables.values():
            await conn.execute(f"DROP TABLE IF EXISTS {table}; "
                               f"CREATE TABLE {table} (LIKE queue_message INCLUDING ALL)")
        await conn.execute("ALTER TABLE bench_without_xact DROP COLUMN xact")
        for i, (what, table) in ((i, t) for i in range(runs) for t in tables.items()):
            await conn.execute(f"TRUNCATE {table}; CHECKPOINT")
            load = load_before()
            started = time.perf_counter()
            await conn.execute(
                f"INSERT INTO {table} (exchange, routing_key, content) "
                f"SELECT 'x', 'rk', {BODY_SQL} FROM generate_series(1, $1) AS g", rows)
            bulk_s = time.perf_counter() - started
            await conn.execute(f"TRUNCATE {table}; CHECKPOINT")
            commits = await _one_row_commits(env.dsn, table, connections=8, seconds=5.0)
            out.append({"kind": "insert_cost", "run": i + 1, "table": what, "rows": rows,
                        "bulk_s": round(bulk_s, 3), "one_row_commits_per_s": round(commits),
                        "load_before": load})
            print(json.dumps(out[-1]), flush=True)
        for table in tables.values():
            await conn.execute(f"DROP TABLE {table}")
    finally:
        await conn.close()
    return out


async def _one_row_commits(dsn: str, table: str, *, connections: int, seconds: float) -> float:
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    end = time.monotonic() + seconds
    counts = [0] * connections

    async def one(i: int) -> None:
        while time.monotonic() < end:
            await conns[i].execute(f"INSERT INTO {table} (exchange, routing_key, content) "
                                   "VALUES ('x', 'rk', '{\"n\": 1}')")
            counts[i] += 1

    try:
        await asyncio.gather(*(one(i) for i in range(connections)))
    finally:
        for c in conns:
            await c.close()
    return sum(counts) / seconds


async def measure(rows: int, live_rate: int, *, relays: list[int], runs: int,
                  quiet_below: float, settings: dict[str, str],
                  with_insert_cost: bool = False, spark: bool = False,
                  before_src: str = "") -> list[dict[str, Any]]:
    """`runs` runs of the scenario for each number of relays, one record each (with
    `before_src`, each run twice: the relay of that checkout, then this tree's)."""
    async with one_off_env("fairness") as (env, records):
        if with_insert_cost:
            await wait_quiet(quiet_below)
            records.extend(await insert_cost(env, rows, runs))
        live_queue = await bind_live_queue(env)
        writer = SparkBulk() if spark else None
        try:
            for n, i in ((n, i) for n in relays for i in range(runs)):
                for build in builds(before_src) if before_src else ("this tree",):
                    await wait_quiet(quiet_below)
                    log_dir = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
                    result = await run_once(env, live_queue, rows, live_rate=live_rate,
                                            relays=n, log_dir=log_dir, settings=settings,
                                            spark=writer)
                    records.add({"run": i + 1, "build": build, **result,
                                 "settings": settings, "logs": str(log_dir)})
        finally:
            await delete_queues([live_queue])
    return records


def report(records: list[dict[str, Any]], run: OneOff, before_src: str = "") -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "Live rows beside a bulk job",
            f"build: {_revision()}"
            + (f"; before = {_revision(before_src)}" if before_src else ""),
            "PostgreSQL: a private initdb cluster with the server's defaults; RabbitMQ on "
            "loopback; `relay run` with its defaults, running before the bulk commits; bulk "
            "rows ~200 bytes of JSON in one INSERT ... SELECT to a durable queue nobody "
            "consumes during the run; live rows one per transaction, Poisson arrivals, to "
            "another durable queue consumed by the benchmark; latency: producer's commit "
            "returned -> consumer received, for live rows committed before the bulk drained"),
        "| run | build | relay settings | relays | bulk by | bulk rows | alone msg/s "
        "| beside live msg/s | drain ratio | live rows | live p50 ms | p95 | p99 | max "
        "| load before (alone / beside) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in records if r.get("kind") != "insert_cost"):
        lines.append(
            f"| {r['run']} | {r.get('build', 'this tree')} | {_settings(r['settings'])} "
            f"| {r['relays']} "
            f"| {r.get('bulk_by', 'INSERT ... SELECT')} | {r['bulk_rows']:,} "
            f"| {r['alone_msg_per_s']:,.0f} "
            f"| {r['beside_live_msg_per_s']:,.0f} | {r['drain_ratio']} "
            f"| {r['live_rows_during_drain']} | {r['live_p50_ms']} | {r['live_p95_ms']} "
            f"| {r['live_p99_ms']} | {r['live_max_ms']} "
            f"| {r['load_before_alone'][0]} / "
            f"{r['load_before_beside'][0]} |")
    cost = [r for r in records if r.get("kind") == "insert_cost"]
    if cost:
        lines += ["", "## What the xact column and its index cost producers", "",
                  "Two copies of the outbox, no trigger on either, one without the column and "
                  "its index, in turn: one INSERT ... SELECT of the bulk's size, and 8 "
                  "connections committing one-row INSERTs for 5 s.", "",
                  "| run | table | bulk rows | bulk INSERT s | one-row commits/s | load before |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['run']} | {r['table']} | {r['rows']:,} | {r['bulk_s']} "
                  f"| {r['one_row_commits_per_s']:,} | {r['load_before'][0]} |" for r in cost]
    return "\n".join(lines) + "\n"


def _settings(settings: dict[str, str]) -> str:
    return ", ".join(f"RELAY_{k.upper()}={v}" for k, v in settings.items()) or "defaults"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run = one_off("bench.fairness", runs=1, options={
        "--rows": {"type": int, "default": 300_000},
        "--live-rate": {"type": int, "default": LIVE_RATE},
        "--relays": {"default": "1",
                     "help": "numbers of relays, in turn: 1,2 (empty: no drain runs)"},
        "--spark": {"action": "store_true",
                    "help": "the bulk written by relay.spark.write_outbox (staged mode)"},
        "--insert-cost": {"action": "store_true",
                          "help": "first, what the xact column and its index cost producers"},
        "--before-src": {"default": "",
                         "help": "another checkout of the relay: each run with it, then this "
                                 "tree's"},
        "--relay-setting": {"action": "append", "default": [],
                            "help": "NAME=VALUE for the relays, e.g. EXPRESS_LANE=false"},
    })
    settings = {k.lower(): v for k, v in (kv.split("=", 1) for kv in args.relay_setting)}
    records = run_on_private_server(lambda: measure(
        args.rows, args.live_rate, relays=[int(n) for n in args.relays.split(",") if n],
        runs=args.runs,
        quiet_below=args.quiet_below, settings=settings, with_insert_cost=args.insert_cost,
        spark=args.spark, before_src=args.before_src))
    run.write(args.out, report(records, run, args.before_src))



if __name__ == "__main__":
    main()
