"""Live rows beside a bulk while a REPEATABLE READ snapshot pins the xmin horizon: one relay,
one-row transactions at 200/s for --pinned-s seconds under the snapshot (their rows deleted
but kept in the indexes), then a bulk of --rows in one transaction with the live rows going on;
the bulk's rate, the live rows' latency while it drained, and PostgreSQL's CPU per 1,000
messages over the drain. On a private cluster with the server's defaults; with --before-src,
two builds alternate (before, after, ...)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import asyncpg

from bench import common
from bench.common import (
    cpu_split,
    insert_backlog,
    load_before,
    relays,
    scenario_env,
    tail_ms,
    wait_drained,
    wait_quiet,
)
from bench.compare import revision
from bench.latency import LIVE_KEY, LIVE_RATE, Producers


def options(parser: argparse.ArgumentParser) -> None:
    """This scenario's own options."""
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--pinned-s", type=float, default=120.0,
                        help="seconds of live rows under the snapshot before the bulk")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--before-src", help="another checkout, run alternately as 'before'")


async def pinned_once(env: common.BenchEnv, rows: int, pinned_s: float) -> dict[str, Any]:
    """One run; see the module docstring."""
    conn = await asyncpg.connect(env.dsn)
    holder = await asyncpg.connect(env.dsn)
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM queue_message")
        async with relays(env, 1, "horizon", consume=env.queue + "-live") as received:
            load = load_before()
            # Enough live rows for the snapshot's time and a drain of the bulk at 2,000/s.
            live = Producers(env, LIVE_RATE, pinned_s + rows / 2000 + 5, connections=1,
                             routing_key=LIVE_KEY)
            producing = asyncio.create_task(live.run())
            await asyncio.sleep(pinned_s)
            with cpu_split(received.pids) as cpu:
                start = await insert_backlog(conn, env, rows)
                end = await wait_drained(conn, env, rows, 900.0)
            await received.wait_for(await producing)
        await holder.execute("ROLLBACK")
    finally:
        await holder.close()
        await conn.close()
    await env.purge()
    during = [(received[k] - t) * 1000 for k, t in live.committed.items() if start <= t <= end]
    window_s = cpu.pop("window_s")
    return {"rows": rows, "pinned_s": pinned_s, "seconds": round(end - start, 3),
            "msg_per_s": round(rows / (end - start), 1),
            "live_rows_during_drain": len(during), **tail_ms(during, "live_"),
            "postgres_ms_per_1k": round(cpu["postgres"] * window_s / rows * 1e6, 1),
            "relay_ms_per_1k": round(cpu["relay"] * window_s / rows * 1e6, 1),
            "load_before": load}


async def alternate(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each run of each build, printed as it comes."""
    out: list[dict[str, Any]] = []
    async with scenario_env("horizon", (LIVE_KEY,)) as env:
        for i in range(args.runs):
            for build in common.builds(args.before_src) if args.before_src else ["this"]:
                await wait_quiet(args.quiet_below)
                result = await pinned_once(env, args.rows, args.pinned_s)
                out.append({"build": build, "run": i + 1, **result})
                print(out[-1], flush=True)
    return out


def measure(args: argparse.Namespace) -> tuple[str, list[str], list[str]]:
    """Run the scenario; the report's title, details and body."""
    with common.private_server():
        runs = common.run(lambda: alternate(args))
    builds = f"this tree = {revision(Path(__file__).parents[1])}"
    if args.before_src:
        builds = (f"before = {revision(Path(args.before_src))}, after = "
                  f"{revision(Path(__file__).parents[1])}")
    lines = ["| build | run | bulk rows | drain msg/s | live rows | live p50 ms | live p99 ms "
             "| CPU ms per 1,000 msgs: PostgreSQL / relay | load before |", "|---" * 9 + "|"]
    lines += [f"| {r['build']} | {r['run']} | {r['rows']:,} | {r['msg_per_s']:,.0f} | "
              f"{r['live_rows_during_drain']} | {r['live_p50_ms']} | {r['live_p99_ms']} | "
              f"{r['postgres_ms_per_1k']} / {r['relay_ms_per_1k']} | {r['load_before'][0]} |"
              for r in runs]
    return ("Live rows beside a bulk, the xmin horizon pinned", [
        f"builds: {builds}",
        f"a REPEATABLE READ snapshot held from {args.pinned_s:g} s before the bulk to its end; "
        f"live one-row transactions at {LIVE_RATE}/s throughout; one relay, default settings"],
        lines)
