"""Spark -> outbox write throughput: each write_outbox mode vs a plain df.write.jdbc append of
the same rows, in one run, rounds interleaved; then the whole path (job start to last message
consumed) with one relay running.

    .venv/bin/python -m bench --scenario spark -- [--rows 1000000] [--rounds 3]
        [--path-rows 200000] [--master standalone|local[2]] [--modes plain,staged,copy,append]
        [--server private|shared] [--quiet-below 1.0] [--out FILE]

`--master standalone` (the default) starts a Spark standalone master and one 2-core worker on
127.0.0.1 from the installed pyspark (tests/spark/standalone.py) and runs the writes there.

PostgreSQL: a private initdb cluster with the server's defaults (bench/common.py), or with
`--server shared` the local one (BENCH_PG_DSN); RabbitMQ: the local one (BENCH_AMQP_URL). Makes
and drops its own database, exchange and queue. Before each write it waits (at most 2 min) for
the 1-minute load average to fall under `--quiet-below`. Writes its block of bench/RESULTS.md
(or --out: the machine, the command, the date and the load average before each write) and
prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench.common import OneOff, load_before, one_off, private_server, wait_quiet
from relay.pg.migrate import migrate
from relay.pg.queries import TableNames
from relay.settings import NotifyMode
from relay.spark import outbox_id, session, write_outbox
from relay.spark.dsn import jdbc_target

ADMIN_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
RELAY_BIN = str(Path(sys.executable).with_name("relay"))
ROOT = Path(__file__).resolve().parents[2]


def frame(spark: Any, rows: int, exchange: str, tag: str) -> Any:
    """`rows` outbox rows of about 200 bytes each (content ~150 bytes of JSON)."""
    from pyspark.sql import functions as F

    return spark.range(0, rows, numPartitions=4).select(
        F.lit(exchange).alias("exchange"),
        F.lit("bench.event").alias("routing_key"),
        F.struct(
            F.col("id").alias("n"),
            F.lit("settlement.completed").alias("type"),
            F.format_string("m-%08d", F.col("id")).alias("merchant"),
            (F.col("id") * 7 % 100_000).alias("cents"),
            F.lit("EUR").alias("currency"),
            F.lit("2024-05-01T00:00:00Z").alias("at"),
            F.lit("x" * 40).alias("pad"),
        ).alias("content"),
        outbox_id(F.lit(tag), F.col("id")).alias("id"),
    )


def plain_append(df: Any, dsn: str) -> None:
    """What teams hand-roll: to_json + df.write.jdbc, same driver options, no idempotency."""
    from pyspark.sql import functions as F

    target = jdbc_target(dsn)
    df.withColumn("content", F.to_json("content")).write.jdbc(
        target.url, "queue_message", mode="append",
        properties=target.properties() | {"batchsize": "10000"},
    )


async def truncate(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE queue_message")
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def whole_path(spark: Any, dsn: str, rows: int) -> float:
    """Seconds from the start of a staged write to the last message consumed, one relay."""
    exchange, queue = f"bench-spark-{secrets.token_hex(3)}", f"bench-spark-{secrets.token_hex(3)}"
    conn = await aio_pika.connect(AMQP_URL)
    channel = await conn.channel()
    await channel.set_qos(prefetch_count=2000)
    x = await channel.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT)
    q = await channel.declare_queue(queue)
    await q.bind(x, "bench.event")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env |= {"RELAY_PG_DSN": dsn, "RELAY_AMQP_URL": AMQP_URL, "RELAY_LOG_LEVEL": "warning"}
    relay = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is timed
        [RELAY_BIN, "run"], env=env, stdout=subprocess.DEVNULL
    )
    seen: set[str] = set()
    tag = ""
    done = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        seen.add(str(message.message_id))
        if len(seen) >= rows:
            done.set()

    try:
        tag = await q.consume(on_message, no_ack=True)
        await asyncio.sleep(2)  # let the relay finish starting: time the path, not start-up
        started = time.monotonic()
        # write_outbox blocks; in a thread the consumer keeps draining meanwhile.
        await asyncio.to_thread(write_outbox, frame(spark, rows, exchange, "path"), dsn=dsn)
        await asyncio.wait_for(done.wait(), timeout=1800)
        return time.monotonic() - started
    finally:
        relay.terminate()
        relay.wait(timeout=60)
        await q.cancel(tag)
        await channel.queue_delete(queue)
        await channel.exchange_delete(exchange)
        await conn.close()


def report(args: argparse.Namespace, run: OneOff, facts: dict[str, Any],
           runs: list[dict[str, Any]], path_s: float) -> str:
    """The Markdown results file: what ran where and when, every write, the medians."""
    rates: dict[str, list[float]] = {}
    for r in runs:
        rates.setdefault(r["mode"], []).append(r["rows_per_s"])
    lines = [
        *run.header(
            "Spark → outbox write benchmark",
            f"master: {facts['master']}; pyspark {facts['pyspark']}; executors 700 MB, 2 cores; "
            f"session start {facts['session_s']:.1f} s",
            f"PostgreSQL: {facts['server']}",
            f"{args.rows:,} rows of about 200 bytes per write, {args.rounds} rounds, the order "
            "of the modes rotated each round, each write after the load average fell under "
            f"{args.quiet_below} (or 2 min); `plain` = to_json + `df.write.jdbc` append (what "
            "teams hand-roll), the other modes `write_outbox(mode=...)`"),
        "| round | mode | rows/s | seconds | load before |", "|---|---|---:|---:|---|",
    ]
    lines += [f"| {r['round']} | {r['mode']} | {r['rows_per_s']:,.0f} | {r['seconds']:.1f} | "
              f"{r['load_before']} |" for r in runs]
    lines += ["", "### Medians", "",
              "| mode | median rows/s | min–max rows/s | median ratio to plain append |",
              "|---|---:|---:|---:|"]
    for mode, values in rates.items():
        ratios = [v / p for v, p in zip(values, rates.get("plain", values), strict=True)]
        lines.append(f"| {mode} | {statistics.median(values):,.0f} | {min(values):,.0f}–"
                     f"{max(values):,.0f} | {statistics.median(ratios):.2f} |")
    if "staged" in rates and "plain" in rates:
        ratio = statistics.median(s / p for s, p in zip(rates["staged"], rates["plain"],
                                                         strict=True))
        lines += ["", f"**staged / plain append: {ratio:.2f}** (target ≥ 0.5: "
                  f"{'met' if ratio >= 0.5 else 'not met'})"]
    if path_s:
        lines += ["", f"Whole path, a staged write of {args.path_rows:,} rows with one relay "
                  f"running, job start to last message consumed: {path_s:.1f} s "
                  f"({args.path_rows / path_s:,.0f} msg/s end to end)."]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace, admin_dsn: str, facts: dict[str, Any],
              ) -> tuple[list[dict[str, Any]], float]:
    """Every write of every round on a database of its own; (runs, whole-path seconds)."""
    name = f"bench_spark_{secrets.token_hex(3)}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = admin_dsn.rsplit("/", 1)[0] + "/" + name
    conn = await asyncpg.connect(dsn)
    await migrate(conn, TableNames(None, "queue_message", "queue_message_notify"),
                  NotifyMode.ALWAYS)
    await conn.close()
    cluster = None
    master = args.master
    if master == "standalone":
        sys.path.insert(0, str(ROOT))  # the repo's tests/
        from tests.spark.standalone import Standalone

        cluster = Standalone(Path(tempfile.mkdtemp(prefix="bench-standalone-"))).start()
        master = cluster.master_url
    t0 = time.monotonic()
    spark = session("bench-spark", master=master, **{
        "spark.ui.enabled": "false", "spark.executor.memory": "700m",
        "spark.cores.max": "2", "spark.pyspark.python": sys.executable})  # copy: executors
    spark.sparkContext.setLogLevel("ERROR")
    facts |= {"session_s": time.monotonic() - t0, "master": args.master,
              "pyspark": spark.version}
    print(f"master {master}, pyspark {spark.version}", flush=True)
    modes = args.modes.split(",")
    runs: list[dict[str, Any]] = []
    try:
        df = frame(spark, args.rows, "bench", "w")
        plain_append(frame(spark, 10_000, "bench", "warm"), dsn)  # JIT and driver warm-up
        for r in range(args.rounds):
            n = len(modes)
            order = modes[r % n:] + modes[:r % n]  # rotate: noise hits all modes
            for mode in order:
                await truncate(dsn)
                await wait_quiet(args.quiet_below)
                load = load_before()
                started = time.monotonic()
                if mode == "plain":
                    plain_append(df, dsn)
                else:
                    write_outbox(df, dsn=dsn, mode=mode)
                elapsed = time.monotonic() - started
                runs.append({"round": r + 1, "mode": mode, "rows_per_s": args.rows / elapsed,
                             "seconds": elapsed, "load_before": load})
                print(f"round {r + 1} {mode:<7} {args.rows / elapsed:>9,.0f} rows/s "
                      f"(load before {load})", flush=True)
        await truncate(dsn)
        path_s = await whole_path(spark, dsn, args.path_rows) if args.path_rows else 0.0
    finally:
        spark.stop()
        if cluster is not None:
            cluster.stop()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return runs, path_s


def main() -> None:
    sys.path.insert(0, str(ROOT))
    args, one = one_off("bench.spark.run", scenario="spark", options={
                            "--rows": {"type": int, "default": 1_000_000},
                            "--rounds": {"type": int, "default": 3},
                            "--path-rows": {"type": int, "default": 200_000,
                                            "help": "0: skip the path"},
                            "--master": {"default": "standalone"},
                            "--modes": {"default": "plain,staged,copy,append"},
                            "--server": {"default": "private", "choices": ("private", "shared"),
                                         "help": "PostgreSQL: a private initdb cluster with the "
                                         "server's defaults (bench/common.py) or the machine's "
                                         "own (BENCH_PG_DSN)"}})
    facts: dict[str, Any] = {}
    print(f"{one.started}, load average before the run: {one.load}", flush=True)
    if args.server == "private":
        with private_server() as dsn:
            facts["server"] = "a private initdb cluster with the server's defaults"
            runs, path_s = asyncio.run(run(args, dsn, facts))
    else:
        facts["server"] = f"the machine's own ({ADMIN_DSN.rsplit('@', 1)[-1]})"
        runs, path_s = asyncio.run(run(args, ADMIN_DSN, facts))
    text = report(args, one, facts, runs, path_s)
    print(text)
    one.write(args.out, text)


if __name__ == "__main__":
    main()
