"""Rows into a RabbitMQ stream beside the same rows into a classic queue, one run.

    python -m bench --scenario streams -- [--rows 100000] [--runs 3]

Each run drains a backlog of `--rows` rows of ~200 bytes committed at once, through one
`relay run` with its defaults: into the scenario's durable classic queue (the outbox, as
bench/drain.py) and then into a stream (the stream table, RELAY_STREAMS=true, every producer
slot to this one relay), alternating. The figure is rows per second from the backlog's commit
to the table's last delete; the ratio is stream over classic within each run. On a private
cluster with the server's defaults (bench/common.py). Writes bench/streams-RESULTS.md.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from rstream import Producer

from bench.common import (
    AMQP_URL,
    BODY_SQL,
    BenchEnv,
    OneOff,
    Relay,
    create_env,
    drop_env,
    load_before,
    one_off,
    run_on_private_server,
    wait_quiet,
)
from bench.drain import drain_once

STREAM_PORT = 5552


def _stream_producer() -> Producer:
    url = urlsplit(AMQP_URL)
    return Producer(url.hostname or "127.0.0.1", STREAM_PORT, username=url.username or "guest",
                    password=url.password or "guest")


async def stream_drain_once(env: BenchEnv, stream: str, rows: int) -> dict[str, Any]:
    """One drain of `rows` stream rows through one relay."""
    relay = Relay(env.relay_env(streams="true"),
                  Path(tempfile.mkdtemp(prefix="bench-streams-")) / "relay.log")
    conn = await asyncpg.connect(env.dsn)
    try:
        await relay.wait_started()
        load = load_before()
        await conn.execute(
            f"INSERT INTO queue_message_stream (stream, content) "
            f"SELECT $1, {BODY_SQL} FROM generate_series(1, $2) AS g", stream, rows)
        committed = time.monotonic()
        await conn.execute("ANALYZE queue_message_stream")
        deadline = committed + 900
        while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queue_message_stream)"):
            if time.monotonic() > deadline:
                raise TimeoutError("stream table not drained after 900 s")
            await asyncio.sleep(0.01)
        seconds = time.monotonic() - committed
        await conn.execute("VACUUM queue_message_stream")
    finally:
        await conn.close()
        relay.stop()
    return {"destination": "stream", "rows": rows, "seconds": round(seconds, 3),
            "msg_per_s": round(rows / seconds, 1), "load_before": load}


async def run(rows: int, runs: int, quiet_below: float) -> list[dict[str, Any]]:
    """Alternate classic and stream drains `runs` times."""
    env = await create_env("streams")
    stream = f"bench-{env.database}"
    producer = _stream_producer()
    await producer.start()
    out = []
    try:
        await producer.create_stream(stream, exists_ok=True)
        for i in range(runs):
            await wait_quiet(quiet_below)
            classic = await drain_once(env, rows)
            out.append({"destination": "classic queue", "rows": rows,
                        "seconds": classic["seconds"], "msg_per_s": classic["msg_per_s"],
                        "load_before": classic["load_before"], "run": i + 1})
            print(out[-1], flush=True)
            await wait_quiet(quiet_below)
            out.append({**await stream_drain_once(env, stream, rows), "run": i + 1})
            print(out[-1], flush=True)
    finally:
        await producer.delete_stream(stream, missing_ok=True)
        await producer.close()
        await drop_env(env)
    return out


def report(results: list[dict[str, Any]], run_: OneOff) -> str:
    """The Markdown results file, with the ratio of each run."""
    lines = run_.header(
        "Rows into a stream beside the same rows into a classic queue",
        "server: a private initdb cluster with the server's defaults; RabbitMQ on loopback",
        "one `relay run` with its defaults; a backlog committed at once; classic: the outbox "
        "to a durable classic queue (persistent messages, publisher confirms); stream: the "
        "stream table over the stream protocol (RELAY_STREAMS=true, 4 producer slots, all to "
        "this relay), deduplicated by the broker")
    lines += ["| run | destination | rows | seconds | msg/s | load before |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['destination']} | {r['rows']:,} | {r['seconds']} | "
              f"{r['msg_per_s']:,.0f} | {r['load_before'][0]} |" for r in results]
    pairs: dict[int, dict[str, float]] = {}
    for r in results:
        pairs.setdefault(r["run"], {})[r["destination"]] = r["msg_per_s"]
    ratios = [p["stream"] / p["classic queue"] for p in pairs.values() if len(p) == 2]
    if ratios:
        lines += ["", "Stream over classic, run by run: " + ", ".join(f"{x:.2f}" for x in ratios)
                  + f" (median {sorted(ratios)[len(ratios) // 2]:.2f})."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run_ = one_off("bench.streams", runs=3,
                         out=Path(__file__).with_name("streams-RESULTS.md"),
                         options={"--rows": {"type": int, "default": 100_000}})
    results = run_on_private_server(lambda: run(args.rows, args.runs, args.quiet_below))
    run_.write(args.out, report(results, run_))


if __name__ == "__main__":
    main()
