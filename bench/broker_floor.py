"""The broker's own floor for a live message beside a bulk drain: no database, no relay.

    python -m bench.broker_floor --out bench/broker-floor-RESULTS.md [--runs 2]
        [--bulk-rates none,11500,max,max/19] [--seconds 15]

bench/fairness.py measures a live row's trip (commit -> consumer) while the relay drains a bulk
job: claim, publish, broker, consumer. This script measures the last two alone, to see what
part of that trip no relay can remove on this machine. A bulk publisher (a process of its own,
persistent ~200-byte messages to a durable queue nobody consumes, publisher confirms, 1,500 in
flight: what the relay's three lanes keep in flight) runs at a fixed rate, or as fast as it can
(`max`), at niceness 0 or 19 (`max/19`: the broker and the live path get the CPU first);
beside it, this process publishes one persistent message per Poisson arrival at 200/s
on a connection of its own to another durable queue, with confirms, and consumes that queue.
Each live message's latency is publish -> consumer received (and publish -> confirm).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from typing import Any

import aio_pika
import aiormq

from bench.common import (
    AMQP_URL,
    OneOff,
    cpu_split,
    delete_queues,
    load_before,
    one_off,
    percentile,
    wait_quiet,
)
from bench.fairness import LIVE_RATE

BODY = json.dumps({"order_id": 1, "customer": "customer-1", "sku": "SKU-000001", "qty": 1,
                   "amount_cents": 37, "currency": "EUR", "note": "x" * 64,
                   "created": "2026-01-01T00:00:00Z"}).encode()
WINDOW = 1500


async def bulk_publisher(queue: str, rate: float, seconds: float) -> None:
    """Publish to `queue` at `rate`/s (0: as fast as confirms allow) for `seconds`; print the
    rate reached as JSON."""
    connection = await aiormq.connect(AMQP_URL)
    channel = await connection.channel()
    await channel.confirm_delivery()
    window = asyncio.Semaphore(WINDOW)
    props = aiormq.spec.Basic.Properties(delivery_mode=2, content_type="application/json")
    sent = 0

    async def confirmed() -> None:
        try:
            await channel.basic_publish(BODY, routing_key=queue, properties=props)
        finally:
            window.release()

    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        await window.acquire()
        task = asyncio.create_task(confirmed())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    start = time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        due = int((now - start) * rate) if rate else sent + 200
        while sent < due:
            await one()
            sent += 1
        await asyncio.sleep(0.002)
    for _ in range(WINDOW):
        await window.acquire()
    elapsed = time.monotonic() - start
    await connection.close()
    print(json.dumps({"sent": sent, "msg_per_s": round(sent / elapsed, 1)}))


async def live(queue: str, seconds: float) -> tuple[list[float], list[float]]:
    """Poisson arrivals at LIVE_RATE/s for `seconds`: publish -> consumer and -> confirm, ms."""
    received: dict[str, float] = {}
    arrived = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        received[str(message.message_id)] = time.monotonic()
        arrived.set()

    consumer = await aio_pika.connect(AMQP_URL)
    publisher = await aio_pika.connect(AMQP_URL)
    sent: dict[str, float] = {}
    confirmed: dict[str, float] = {}
    try:
        cch = await consumer.channel()
        await cch.set_qos(prefetch_count=1000)
        await (await cch.get_queue(queue)).consume(on_message, no_ack=True)
        pch = await publisher.channel(publisher_confirms=True)

        async def send(i: int) -> None:
            key = str(i)
            sent[key] = time.monotonic()
            await pch.default_exchange.publish(
                aio_pika.Message(BODY, message_id=key, delivery_mode=2), routing_key=queue)
            confirmed[key] = time.monotonic()

        tasks = []
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(send(i)))
            i += 1
            await asyncio.sleep(random.expovariate(LIVE_RATE))
        await asyncio.gather(*tasks)
        deadline = time.monotonic() + 30
        while sent.keys() - received.keys():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(sent.keys() - received.keys())} live messages "
                                   "never reached the consumer")
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), timeout=deadline - time.monotonic())
    finally:
        await publisher.close()
        await consumer.close()
    return ([(received[k] - t) * 1000 for k, t in sent.items()],
            [(confirmed[k] - t) * 1000 for k, t in sent.items()])


async def _declare_empty(names: tuple[str, str]) -> None:
    """Declare the two durable queues, emptied (again, after a phase)."""
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        for name in names:
            await (await channel.declare_queue(name, durable=True)).purge()
    finally:
        await connection.close()


async def run_once(names: tuple[str, str], phase: tuple[float | None, int], seconds: float,
                   ) -> dict[str, Any]:
    """One phase: live alone (rate None), or beside a bulk publisher at `rate` (0: max) run
    at niceness `nice`."""
    rate, nice = phase
    bulk, live_queue = names
    load = load_before()
    proc = None
    if rate is not None:
        proc = await asyncio.create_subprocess_exec(
            "nice", "-n", str(nice), sys.executable, "-m", "bench.broker_floor",
            "--bulk-publisher", bulk,
            "--bulk-rate", str(rate), "--seconds", str(seconds + 2), "--out", os.devnull,
            stdout=asyncio.subprocess.PIPE)
        await asyncio.sleep(1.0)  # the publisher connected and running before live begins
    with cpu_split([]) as cpu:
        deliver, confirm = await live(live_queue, seconds)
    bulk_rate = None
    if proc is not None:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"the bulk publisher exited {proc.returncode}")
        bulk_rate = json.loads(out.decode().strip().splitlines()[-1])["msg_per_s"]
    await _declare_empty(names)
    return {
        "bulk_target": "none" if rate is None else ("max" if rate == 0 else f"{rate:,.0f}")
        + (f", nice {nice}" if nice else ""),
        "bulk_msg_per_s": bulk_rate, "live": len(deliver),
        "deliver_p50_ms": round(percentile(deliver, 50), 2),
        "deliver_p95_ms": round(percentile(deliver, 95), 2),
        "deliver_p99_ms": round(percentile(deliver, 99), 2),
        "deliver_max_ms": round(max(deliver), 2),
        "confirm_p50_ms": round(percentile(confirm, 50), 2),
        "confirm_p99_ms": round(percentile(confirm, 99), 2),
        "broker_cores": round(cpu.get("rabbitmq", 0.0), 2),
        "busy_cores": round(cpu.get("machine_busy", 0.0), 2), "load_before": load,
    }


async def measure(rates: list[tuple[float | None, int]], runs: int, seconds: float,
                  quiet_below: float) -> list[dict[str, Any]]:
    """Every phase, `runs` times, alternating."""
    names = (f"floor-{os.getpid()}-bulk", f"floor-{os.getpid()}-live")
    await _declare_empty(names)
    records = []
    try:
        for run in range(1, runs + 1):
            for rate in rates:
                await wait_quiet(quiet_below)
                record = await run_once(names, rate, seconds)
                record["run"] = run
                print(record, flush=True)
                records.append(record)
    finally:
        await delete_queues(names)
    return records


def report(records: list[dict[str, Any]], run: OneOff, seconds: float) -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "The broker's floor for a live message beside a bulk drain",
            f"{seconds:g} s per phase; bulk: persistent ~200-byte messages to a durable queue "
            f"nobody consumes, confirms, {WINDOW} in flight, its own process; live: one "
            f"persistent message per Poisson arrival at {LIVE_RATE}/s, confirms, its own "
            "connection, to another durable queue consumed by this process; no database, "
            "no relay"),
        "| run | bulk target msg/s | bulk reached msg/s | live messages | publish -> consumer "
        "p50 ms | p95 | p99 | max | publish -> confirm p50 ms | p99 | broker cores "
        "| machine busy cores | load before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['run']} | {r['bulk_target']} | "
        f"{'-' if r['bulk_msg_per_s'] is None else format(r['bulk_msg_per_s'], ',.0f')} "
        f"| {r['live']} | {r['deliver_p50_ms']} | {r['deliver_p95_ms']} "
        f"| {r['deliver_p99_ms']} | {r['deliver_max_ms']} | {r['confirm_p50_ms']} "
        f"| {r['confirm_p99_ms']} | {r['broker_cores']} | {r['busy_cores']} "
        f"| {r['load_before'][0]} |" for r in records]
    return "\n".join(lines) + "\n"


def _rates(text: str) -> list[tuple[float | None, int]]:
    """`none,11500,max,max/19`: live alone, beside a bulk at 11,500/s, beside a bulk at full
    speed, the same with the bulk process at niceness 19."""
    phases: list[tuple[float | None, int]] = []
    for part in text.split(","):
        rate, _, nice = part.partition("/")
        phases.append((None if rate == "none" else 0.0 if rate == "max" else float(rate),
                       int(nice or 0)))
    return phases


def main() -> None:
    """Parse arguments; run the phases (or, with --bulk-publisher, be the bulk process)."""
    args, run = one_off("bench.broker_floor", runs=2, seconds=15.0, options={
        "--bulk-rates": {"default": "none,11500,max,max/19", "type": _rates,
                         "help": "phases: none (live alone), a bulk rate or max, /niceness"},
        "--bulk-publisher": {"default": "", "help": argparse.SUPPRESS},
        "--bulk-rate": {"type": float, "default": 0.0, "help": argparse.SUPPRESS},
    })
    if args.bulk_publisher:
        asyncio.run(bulk_publisher(args.bulk_publisher, args.bulk_rate, args.seconds))
        return
    records = asyncio.run(measure(args.bulk_rates, args.runs, args.seconds, args.quiet_below))
    run.write(args.out, report(records, run, args.seconds))


if __name__ == "__main__":
    main()
