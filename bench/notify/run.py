"""Benchmark of the notify modes (docs/notify.md), in one run against the local servers.

1. Commit rate: pgbench, 8 and 32 clients, one 1-row INSERT per transaction, with the trigger
   of each mode (off = no trigger, always, conditional) and a real `relay run` draining the
   table all along; rounds interleave the modes so that machine noise hits them alike.
   Notifications sent during each run are counted on a separate LISTEN connection.
2. Latency: pgbench commits 1,000 single-row transactions per second (--rate, 8 clients)
   for a few seconds per mode; insert -> receipt by a consumer (each row carries the
   database clock at its INSERT, a fraction of a millisecond before its commit).

Usage: .venv/bin/python bench/notify/run.py [--rounds 3] [--seconds 8] [--latency-seconds 10]
Writes bench/notify/last-run.json and prints the tables that bench/notify-RESULTS.md quotes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from relay.pg.migrate import migrate
from relay.pg.queries import TableNames
from relay.settings import NotifyMode

PG = os.environ.get("RELAY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP = os.environ.get("RELAY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
NAMES = TableNames(None, "queue_message", "queue_message_notify")
MODES = ("off", "always", "conditional")
RELAY_BIN = str(Path(sys.executable).with_name("relay"))
INSERT = ("INSERT INTO queue_message (exchange, routing_key, content) "
          "VALUES ('{x}', 'rk', '{{\"n\": 1}}');\n")


def with_db(dsn: str, name: str) -> str:
    """The same server DSN pointing at database `name`."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


async def set_mode(dsn: str, mode: str) -> None:
    """`relay migrate` with this mode: switches the trigger on the live table."""
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, NAMES, NotifyMode(mode))
    finally:
        await conn.close()


def pgbench(dsn: str, script: Path, clients: int, seconds: int) -> float:
    """Commits per second of one pgbench run."""
    out = subprocess.run(
        ["pgbench", "-n", "-f", str(script), "-c", str(clients), "-j", "2", "-T", str(seconds),
         dsn], capture_output=True, text=True, check=True,
    )
    match = re.search(r"tps = ([\d.]+)", out.stdout)
    assert match, out.stdout + out.stderr
    return float(match.group(1))


class Counter:
    """Counts notifications on the outbox channel."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, *_: object) -> None:
        self.n += 1


async def commit_rates(dsn: str, exchange: str, rounds: int, seconds: int) -> list[dict[str, Any]]:
    """pgbench rounds: every mode and client count once per round."""
    script = Path(tempfile.mkdtemp()) / "insert.sql"
    script.write_text(INSERT.format(x=exchange))
    listen = await asyncpg.connect(dsn)
    counter = Counter()
    await listen.add_listener(NAMES.channel, counter)
    results = []
    for r in range(rounds):
        for clients in (8, 32):
            for mode in MODES:
                await set_mode(dsn, mode)
                await asyncio.sleep(0.5)  # the relay re-reads the mode
                before = counter.n
                tps = await asyncio.to_thread(pgbench, dsn, script, clients, seconds)
                await listen.execute("SELECT 1")
                await asyncio.sleep(0.2)
                left = await listen.fetchval("SELECT count(*) FROM queue_message")
                # Rows the relay took meanwhile: a run where it drained (almost) nothing, e.g.
                # because another test suite restarted the shared broker, is marked invalid.
                drained_per_s = round(max(tps * seconds - left, 0) / seconds)
                row = {"round": r + 1, "clients": clients, "mode": mode, "tps": round(tps),
                       "notifications": counter.n - before, "rows_left": left,
                       "relay_drained_per_s": drained_per_s, "valid": drained_per_s >= 200}
                print(json.dumps(row), flush=True)
                results.append(row)
                await drain(listen)
    await listen.close()
    return results


async def drain(conn: asyncpg.Connection, timeout_s: float = 120) -> None:
    """Wait until the relay emptied the table, so every run starts alike."""
    deadline = time.monotonic() + timeout_s
    while await conn.fetchval("SELECT count(*) FROM queue_message") > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the relay did not drain the table")
        await asyncio.sleep(0.2)


async def latency(
    dsn: str, exchange: str, queue: str, mode: str, *, seconds: int, rate: int
) -> dict[str, Any]:
    """Commit -> receipt at `rate` single-row commits per second (pgbench --rate, 8 clients:
    Poisson arrivals). Each row carries the database clock at its INSERT; the consumer
    subtracts it from its own clock at receipt (same machine, same clock)."""
    await set_mode(dsn, mode)
    await asyncio.sleep(0.5)
    script = Path(tempfile.mkdtemp()) / "insert_ts.sql"
    script.write_text(
        "INSERT INTO queue_message (exchange, routing_key, content) VALUES "
        f"('{exchange}', 'rk', jsonb_build_object('t', "
        "extract(epoch FROM clock_timestamp())::float8));\n"
    )
    lat: list[float] = []
    amqp = await aio_pika.connect(AMQP)
    channel = await amqp.channel()
    await channel.set_qos(prefetch_count=5000)
    q = await channel.get_queue(queue)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        lat.append((time.time() - json.loads(message.body)["t"]) * 1000)

    await q.consume(on_message, no_ack=True)
    listen = await asyncpg.connect(dsn)
    counter = Counter()
    await listen.add_listener(NAMES.channel, counter)
    out = await asyncio.to_thread(
        subprocess.run,
        ["pgbench", "-n", "-f", str(script), "-c", "8", "-j", "2", "--rate", str(rate),
         "-T", str(seconds), dsn], capture_output=True, text=True, check=True,
    )
    total = int(re.search(r"processed: (\d+)", out.stdout).group(1))  # type: ignore[union-attr]
    deadline = time.monotonic() + 60
    while len(lat) < total and time.monotonic() < deadline:  # noqa: ASYNC110 - a deadline too
        await asyncio.sleep(0.1)
    await listen.close()
    await amqp.close()
    lat.sort()
    qs = statistics.quantiles(lat, n=100)
    row = {"mode": mode, "target_rate_per_s": rate, "rate_per_s": round(total / seconds),
           "n": len(lat),
           "missing": total - len(lat), "p50_ms": round(qs[49], 1), "p90_ms": round(qs[89], 1),
           "p99_ms": round(qs[98], 1), "max_ms": round(lat[-1], 1),
           "notifications": counter.n}
    print(json.dumps(row), flush=True)
    return row


async def main() -> None:
    """Set up a database, a broker queue and a relay; run both benchmarks; clean up."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--latency-seconds", type=int, default=10)
    parser.add_argument("--skip-rates", action="store_true", help="latency part only")
    parser.add_argument("--modes", default=",".join(MODES), help="modes of the latency part")
    parser.add_argument("--rates", default="1000,300", help="commits/s of the latency part")
    parser.add_argument("--relay-setting", action="append", default=[],
                        help="NAME=VALUE for the relay, e.g. AWAKE_POLL_INTERVAL_S=0.002")
    args = parser.parse_args()
    name = f"bench_notify_{secrets.token_hex(3)}"
    admin = await asyncpg.connect(PG)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = with_db(PG, name)
    exchange, queue = f"{name}-x", f"{name}-q"
    amqp = await aio_pika.connect(AMQP)
    ch = await amqp.channel()
    x = await ch.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT)
    # Bounded queue: during the pgbench runs nobody consumes, the broker drops the oldest.
    qq = await ch.declare_queue(queue, arguments={"x-max-length": 10000})
    await qq.bind(x, "rk")
    await set_mode(dsn, "conditional")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(RELAY_PG_DSN=dsn, RELAY_AMQP_URL=AMQP, RELAY_LOG_FORMAT="json",
               RELAY_LOG_LEVEL=os.environ.get("BENCH_RELAY_LOG_LEVEL", "warning"))
    env.update(("RELAY_" + kv.split("=", 1)[0], kv.split("=", 1)[1]) for kv in args.relay_setting)
    relay = subprocess.Popen([RELAY_BIN, "run"], env=env)  # noqa: ASYNC220 - runs alongside
    try:
        await asyncio.sleep(2)
        rates = [] if args.skip_rates else await commit_rates(
            dsn, exchange, args.rounds, args.seconds)
        await qq.purge()
        lats = [await latency(dsn, exchange, queue, m, seconds=args.latency_seconds, rate=int(r))
                for r in args.rates.split(",") if r for m in args.modes.split(",")]
    finally:
        relay.terminate()
        relay.wait(timeout=30)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        await amqp.close()
        # A fresh connection: the shared broker may have been restarted meanwhile.
        amqp = await aio_pika.connect(AMQP)
        ch = await amqp.channel()
        await ch.queue_delete(queue)
        await ch.exchange_delete(exchange)
        await amqp.close()
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit_rates": rates, "latency": lats}
    Path(__file__).with_name("last-run.json").write_text(json.dumps(out, indent=1))
    summarize(rates)


def summarize(rates: list[dict[str, Any]]) -> None:
    """Median, spread and per-round ratio to no trigger, per client count and mode."""
    if not rates:
        return
    for clients in (8, 32):
        print(f"\n{clients} clients: mode | tps median (min-max) | ratio to off per round "
              "| notifications per run")
        base = {r["round"]: r["tps"] for r in rates if r["clients"] == clients
                and r["mode"] == "off" and r["valid"]}
        for mode in MODES:
            rows = [r for r in rates if r["clients"] == clients and r["mode"] == mode
                    and r["valid"]]
            tps = [r["tps"] for r in rows] or [0]
            ratios = [round(r["tps"] / base[r["round"]], 2) for r in rows if r["round"] in base]
            print(f"{mode} | {statistics.median(tps):.0f} ({min(tps)}-{max(tps)}) | {ratios} "
                  f"| {[r['notifications'] for r in rows]}")


if __name__ == "__main__":
    asyncio.run(main())
