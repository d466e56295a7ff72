"""Profile one `relay run` with py-spy, draining a backlog or woken by a trickle of commits;
summarise where its CPU goes.

    python -m bench.profile --scenario drain --rows 100000 --label after
    python -m bench.profile --scenario trickle --seconds 20 --label after
    python -m bench.profile --scenario rate --rate 3000 --connections 16 --seconds 10 --label 3000
    BENCH_RELAY_SRC=<main checkout> python -m bench.profile --scenario trickle --label before

The trickle is one 1-row commit every 20 ms (the relay sleeps between them), so the samples
are the cost of wake-ups: CPU per wake-up = samples / rate / commits. `rate` runs the latency
scenario's producers (bench/producer.py: 1-row commits, Poisson arrivals) at --rate commits/s
over --connections: the cost per message of a steady flow.

Needs py-spy (`pip install py-spy`) and ptrace rights (root, or CAP_SYS_PTRACE). Writes the
collapsed stacks (flamegraph input) and prints the top functions by own time and the share
of samples under each layer (relay, aiormq/aio-pika, pamqp, asyncpg, idle in the loop).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

from bench.common import (
    RELAY_SRC,
    ROUTING_KEY,
    TRACED_OPTIONS_SQL,
    Relay,
    cpu_s,
    create_env,
    drop_env,
    insert_backlog,
    load_before,
    wait_empty,
)
from bench.latency import produce

RATE_HZ = 250

LAYERS = (
    ("relay", "relay/"),
    ("aiormq/aio-pika", "aiormq/"),
    ("aiormq/aio-pika", "aio_pika/"),
    ("pamqp", "pamqp/"),
    ("asyncpg", "asyncpg/"),
    ("pydantic", "pydantic"),
    ("structlog", "structlog/"),
)


def _layer_of(frames: list[str]) -> str:
    """Who is executing: the deepest frame in a known layer (the loop's own C code = idle)."""
    if frames[-1].startswith(("Runner.run", "run (uvloop", "run_until_complete")):
        return "event loop itself (uvloop C: socket I/O, callbacks)"
    for frame in reversed(frames):
        for name, marker in LAYERS:
            if marker in frame:
                return name
    return "other (stdlib asyncio, interpreter)"


def summarise(collapsed: Path, top: int = 15) -> str:
    """Own-time leaders and layer shares from py-spy's raw (collapsed) output."""
    own: collections.Counter[str] = collections.Counter()
    layer: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1].split(" (")[0] + " (" + frames[-1].split(" (")[-1]] += count
        layer[_layer_of(frames)] += count
    lines = [f"samples: {total}", "", "share of samples by the deepest layer executing:"]
    lines += [f"  {name:<28} {n / total:6.1%}" for name, n in layer.most_common()]
    lines += ["", f"top {top} functions by own time:"]
    lines += [f"  {n / total:6.1%}  {fn}" for fn, n in own.most_common(top)]
    return "\n".join(lines)


async def _trickle(conn: asyncpg.Connection, exchange: str, seconds: float) -> int:
    """One 1-row commit every 20 ms; return the number of commits."""
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await conn.execute("INSERT INTO queue_message (exchange, routing_key, content) "
                           "VALUES ($1, $2, '{\"n\": 1}')", exchange, ROUTING_KEY)
        n += 1
        await asyncio.sleep(0.02)
    return n


async def profile(scenario: str, publisher: str, rows: int, seconds: float, *, out: Path,
                  label: str, traced: bool = False, rate: int = 1000,
                  connections: int = 4) -> tuple[Path, str]:
    """Run the scenario under py-spy; return the collapsed-stacks file and a headline."""
    env = await create_env(f"prof_{scenario}")
    collapsed = out / f"profile-{scenario}-{label}.collapsed.txt"
    load = load_before()
    try:
        relay = Relay(env.relay_env(publisher=publisher), Path(tempfile.mkdtemp()) / "relay.log")
        await relay.wait_started()
        spy = await asyncio.create_subprocess_exec(
            shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
            "record", "--pid", str(relay.proc.pid), "--rate", str(RATE_HZ), "--format", "raw",
            "--nonblocking", "-o", str(collapsed),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        conn = await asyncpg.connect(env.dsn)
        try:
            await asyncio.sleep(1.0)  # py-spy attaches
            cpu0 = cpu_s(relay.proc.pid)
            if scenario == "drain":
                committed = await insert_backlog(
                    conn, env, rows, TRACED_OPTIONS_SQL if traced else "NULL")
                emptied = await wait_empty(conn, 600)
                head = (f"{rows} rows{' (a traceparent each)' if traced else ''} in "
                        f"{emptied - committed:.2f}s = "
                        f"{rows / (emptied - committed):,.0f} msg/s (under py-spy)")
                count = rows
            elif scenario == "rate":
                produced = await produce(env, rate, connections, seconds,
                                         Path(tempfile.mkdtemp()) / "ids.txt")
                await wait_empty(conn, 60)
                count = int(produced["commits"])
                head = (f"{count} 1-row commits at {produced['achieved_per_s']}/s on "
                        f"{connections} connections")
            else:
                count = await _trickle(conn, env.exchange, seconds)
                await wait_empty(conn, 60)
                head = f"{count} 1-row commits, one every 20 ms, each a wake-up"
            cpu = cpu_s(relay.proc.pid) - cpu0
        finally:
            await conn.close()
        spy.send_signal(signal.SIGINT)
        await asyncio.wait_for(spy.wait(), timeout=30)
        relay.stop()
    finally:
        await drop_env(env)
    unit = "wake-up" if scenario == "trickle" else "message"
    head += (f"; load average before {load[0]}; relay CPU (/proc, user+system, py-spy "
             f"attached) {cpu:.2f} s = {cpu / count * 1e6:,.0f} µs per {unit}. py-spy samples "
             "wall-clock stacks: a leaf in Runner.run is uvloop's C loop, mostly waiting in "
             "epoll, not CPU")
    return collapsed, head


def main() -> int:
    """Profile, then print and save the summary."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--scenario", default="drain", choices=("drain", "trickle", "rate"))
    parser.add_argument("--publisher", default="bulk", choices=("bulk", "simple"))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=1000, help="rate: commits per second")
    parser.add_argument("--connections", type=int, default=4, help="rate: producer connections")
    parser.add_argument("--label", default="after")
    parser.add_argument("--traced", action="store_true",
                        help="drain: every row carries its own traceparent in options.headers")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "profiles")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    collapsed, head = asyncio.run(profile(args.scenario, args.publisher, args.rows,
                                          args.seconds, out=args.out, label=args.label,
                                          traced=args.traced, rate=args.rate,
                                          connections=args.connections))
    text = (f"command: python -m bench.profile {' '.join(sys.argv[1:])}\n"
            f"relay source: {RELAY_SRC or 'this checkout'}\n{head}\n\n" + summarise(collapsed))
    (args.out / f"profile-{args.scenario}-{args.label}.summary.txt").write_text(text + "\n")
    print(text)
    print(f"({time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
