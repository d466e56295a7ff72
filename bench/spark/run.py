"""Spark -> outbox writes: each write_outbox mode against a plain `df.write.jdbc` append of the
same rows, rounds interleaved, then the whole path with one relay running; `--master
standalone` starts a master and a 2-core worker from the installed pyspark."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import load_before, scenario_env, sql, wait_quiet
from relay.spark import outbox_id, session, write_outbox
from relay.spark.dsn import jdbc_target


def frame(spark: Any, rows: int, exchange: str, tag: str) -> Any:
    """`rows` outbox rows of about 200 bytes each (content ~150 bytes of JSON)."""
    from pyspark.sql import functions as F

    return spark.range(0, rows, numPartitions=4).select(
        F.lit(exchange).alias("exchange"), F.lit(common.ROUTING_KEY).alias("routing_key"),
        F.struct(F.col("id").alias("n"), F.lit("settlement.completed").alias("type"),
                 F.format_string("m-%08d", F.col("id")).alias("merchant"),
                 (F.col("id") * 7 % 100_000).alias("cents"), F.lit("EUR").alias("currency"),
                 F.lit("2024-05-01T00:00:00Z").alias("at"), F.lit("x" * 40).alias("pad"),
                 ).alias("content"),
        outbox_id(F.lit(tag), F.col("id")).alias("id"))


def plain_append(df: Any, dsn: str) -> None:
    """What teams hand-roll: to_json + df.write.jdbc, same driver options, no idempotency."""
    from pyspark.sql import functions as F

    target = jdbc_target(dsn)
    df.withColumn("content", F.to_json("content")).write.jdbc(
        target.url, "queue_message", mode="append",
        properties=target.properties() | {"batchsize": "10000"})


async def whole_path(spark: Any, env: common.BenchEnv, rows: int) -> float:
    """Seconds from the start of a staged write to the last message consumed, one relay."""
    async with common.relays(env, 1, "spark", consume=env.queue) as received:
        started = time.monotonic()
        # write_outbox blocks; in a thread the consumer keeps taking messages meanwhile.
        await asyncio.to_thread(write_outbox, frame(spark, rows, env.exchange, "path"),
                                dsn=env.dsn)
        await received.wait_for(count=rows, timeout_s=1800)
        return max(received.values()) - started


async def writes_and_path(args: argparse.Namespace, facts: dict[str, Any],
                          ) -> tuple[list[Any], float]:
    """Every write of every round on a database of its own; (writes, whole-path seconds)."""
    cluster, master = None, args.master
    if master == "standalone":
        from tests.spark.standalone import Standalone

        cluster = Standalone(Path(tempfile.mkdtemp(prefix="bench-standalone-"))).start()
        master = cluster.master_url
    t0 = time.monotonic()
    spark = session("bench-spark", master=master, **{
        "spark.ui.enabled": "false", "spark.executor.memory": "700m", "spark.cores.max": "2",
        "spark.pyspark.python": sys.executable})
    spark.sparkContext.setLogLevel("ERROR")
    facts |= {"session_s": time.monotonic() - t0, "pyspark": spark.version}
    modes, writes = args.modes.split(","), []
    try:
        async with scenario_env("spark") as env:
            df = frame(spark, args.rows, "bench", "w")
            plain_append(frame(spark, 10_000, "bench", "warm"), env.dsn)  # JIT, driver warm-up
            for r in range(args.rounds):
                for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotated
                    await sql(env.dsn, "TRUNCATE queue_message", "CHECKPOINT")
                    await wait_quiet(args.quiet_below)
                    load, started = load_before(), time.monotonic()
                    plain_append(df, env.dsn) if mode == "plain" else write_outbox(
                        df, dsn=env.dsn, mode=mode)
                    seconds = time.monotonic() - started
                    writes.append({"round": r + 1, "mode": mode, "seconds": seconds,
                                   "rows_per_s": args.rows / seconds, "load_before": load})
                    print(writes[-1], flush=True)
            await sql(env.dsn, "TRUNCATE queue_message")
            path_s = await whole_path(spark, env, args.path_rows) if args.path_rows else 0.0
    finally:
        spark.stop()
        if cluster is not None:
            cluster.stop()
    return writes, path_s


def options(parser: argparse.ArgumentParser) -> None:
    """This scenario's own options."""
    for flag, default in (("--rows", 1_000_000), ("--rounds", 3), ("--path-rows", 200_000)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--master", default="standalone", help="standalone or local[2]")
    parser.add_argument("--modes", default="plain,staged,copy,append")


def measure(args: argparse.Namespace) -> tuple[str, list[str], list[str]]:
    """Every write on a private cluster with the server's defaults; the report's title,
    details, and every write and each mode's median and ratio to the plain append."""
    facts: dict[str, Any] = {}
    with common.private_server():
        writes, path_s = asyncio.run(writes_and_path(args, facts))
    rates: dict[str, list[float]] = {}
    for w in writes:
        rates.setdefault(w["mode"], []).append(w["rows_per_s"])
    lines = ["| round | mode | rows/s | seconds | load before |", "|---|---|---:|---:|---|",
             *(f"| {w['round']} | {w['mode']} | {w['rows_per_s']:,.0f} | {w['seconds']:.1f} | "
               f"{w['load_before']} |" for w in writes),
             "", "| mode | median rows/s | min–max rows/s | median ratio to plain append |",
             "|---|---:|---:|---:|"]
    ratios = {mode: statistics.median(v / p for v, p in zip(
        values, rates.get("plain", values), strict=True)) for mode, values in rates.items()}
    lines += [f"| {mode} | {statistics.median(values):,.0f} | {min(values):,.0f}–"
              f"{max(values):,.0f} | {ratios[mode]:.2f} |" for mode, values in rates.items()]
    if "staged" in rates and "plain" in rates:
        lines += ["", f"**staged / plain append: {ratios['staged']:.2f}** (target ≥ 0.5: "
                  + ("met)" if ratios["staged"] >= 0.5 else "not met)")]
    if path_s:
        lines += ["", f"Whole path, a staged write of {args.path_rows:,} rows with one relay "
                  f"running, job start to last message consumed: {path_s:.1f} s "
                  f"({args.path_rows / path_s:,.0f} msg/s end to end)."]
    return "Spark → outbox write benchmark", [
        f"master: {args.master}; pyspark {facts['pyspark']}; executors 700 MB, 2 cores; "
        f"session start {facts['session_s']:.1f} s",
        "PostgreSQL: a private initdb cluster with the server's defaults",
        f"{args.rows:,} rows of about 200 bytes per write, {args.rounds} rounds, the order of "
        f"the modes rotated each round, each write after the load average fell under "
        f"{args.quiet_below} (or 5 min); `plain` = to_json + `df.write.jdbc` append (what teams "
        "hand-roll), the other modes `write_outbox(mode=...)`"], lines
