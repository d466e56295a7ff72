"""Drain rate by batch shape: `RELAY_BATCH_SIZE` x `RELAY_CONCURRENCY`, beside the broker's
own publish limit, in one run on a private cluster.

    python -m bench.drainshape --shapes 500x3,500x6,1000x3 --rows 100000 --runs 2 \
        --out bench/compare/drain-shape.md

Each drain: one `relay run` (bench/drain.py), backlog committed at once; the limit: the relay's
BulkPublisher alone with 3 x 500 in flight, no database (bench/limits.py). Shapes alternate
run by run. Writes a Markdown report with the machine, the command, the date and the load
average before every run.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import OneOff, load_before, one_off, one_off_env, wait_quiet
from bench.compare import _revision
from bench.drain import drain_once
from bench.limits import bulk_frame_limit
from bench.server import run_on_private_server


async def measure(shapes: list[tuple[int, int]], rows: int, runs: int,
                  quiet_below: float) -> list[dict[str, Any]]:
    """Per run: the publish limit, then each shape's drain."""
    async with one_off_env("drainshape") as (env, records):
        for i in range(runs):
            await wait_quiet(quiet_below)
            load = load_before()
            limit = await bulk_frame_limit(env, rows)
            records.add({"run": i + 1, "shape": "publish limit (no database)",
                         "msg_per_s": round(limit["msg_per_s"], 1), "load_before": load,
                         "cpu_cores": None})
            for batch, lanes in shapes:
                await wait_quiet(quiet_below)
                load = load_before()
                result = await drain_once(env, rows, batch_size=batch, concurrency=lanes)
                records.add({"run": i + 1, "shape": f"{batch} x {lanes}",
                             "msg_per_s": result["msg_per_s"], "load_before": load,
                             "cpu_cores": result["cpu_cores"]})
    return records


def report(records: list[dict[str, Any]], run: OneOff, rows: int) -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "Drain rate by batch shape, beside the broker's publish limit",
            f"build: {_revision()}",
            f"{rows:,} rows per drain; PostgreSQL: a private initdb cluster with the server's "
            "defaults; shape = RELAY_BATCH_SIZE x RELAY_CONCURRENCY (500 x 3 is the default)"),
        "| run | shape | msg/s | CPU cores: relay / postgres / rabbitmq / machine | "
        "load before |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        c = r["cpu_cores"]
        cores = (f"{c['relay']} / {c['postgres']} / {c['rabbitmq']} / {c['machine_busy']}"
                 if c else "-")
        lines.append(f"| {r['run']} | {r['shape']} | {r['msg_per_s']:,.0f} | {cores} | "
                     f"{r['load_before']} |")
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    medians = {s: statistics.median(r["msg_per_s"] for r in records if r["shape"] == s)
               for s in shapes}
    limit = medians[shapes[0]]
    lines += ["", "## Medians", "", "| shape | msg/s | vs the publish limit |", "|---|---|---|"]
    lines += [f"| {s} | {m:,.0f} | {m / limit:.2f} |" for s, m in medians.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run = one_off("bench.drainshape", runs=2,
                        options={"--shapes": {"default": "500x3,500x6,1000x3"},
                                 "--rows": {"type": int, "default": 100_000}})
    shapes = [(int(b), int(c)) for b, c in (s.split("x") for s in args.shapes.split(","))]
    records = run_on_private_server(
        lambda: measure(shapes, args.rows, args.runs, args.quiet_below))
    run.write(args.out, report(records, run, args.rows))


if __name__ == "__main__":
    main()
