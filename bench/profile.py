"""Profile one `relay run` draining a backlog with py-spy; summarise where its CPU goes.

    python -m bench.profile --publisher simple --rows 100000 --out bench/profiles

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

from bench.common import Relay, create_env, drop_env, insert_backlog, wait_empty

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


async def profile(publisher: str, rows: int, out: Path) -> Path:
    """Drain `rows` rows under py-spy; return the collapsed-stacks file."""
    env = await create_env(f"prof_{publisher}")
    collapsed = out / f"profile-{publisher}.collapsed.txt"
    try:
        relay = Relay(env.relay_env(publisher=publisher), Path(tempfile.mkdtemp()) / "relay.log")
        await relay.wait_started()
        spy = await asyncio.create_subprocess_exec(
            shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
            "record", "--pid", str(relay.proc.pid), "--rate", "250", "--format", "raw",
            "--nonblocking", "-o", str(collapsed),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        conn = await asyncpg.connect(env.dsn)
        try:
            await asyncio.sleep(1.0)  # py-spy attaches
            committed = await insert_backlog(conn, env, rows)
            emptied = await wait_empty(conn, 600)
        finally:
            await conn.close()
        spy.send_signal(signal.SIGINT)
        await asyncio.wait_for(spy.wait(), timeout=30)
        relay.stop()
        print(f"{publisher}: {rows} rows in {emptied - committed:.2f}s "
              f"= {rows / (emptied - committed):,.0f} msg/s (under py-spy)")
    finally:
        await drop_env(env)
    return collapsed


def main() -> int:
    """Profile, then print and save the summary."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--publisher", default="bulk", choices=("bulk", "simple"))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "profiles")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    collapsed = asyncio.run(profile(args.publisher, args.rows, args.out))
    text = summarise(collapsed)
    (args.out / f"profile-{args.publisher}.summary.txt").write_text(text + "\n")
    print(text)
    print(f"({time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
