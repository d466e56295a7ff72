"""Where a big backlog's drain rate goes: the relay's drain and the broker's own publish limit,
each at 100,000 and at 1,000,000 messages, in one run on a private cluster.

    python -m bench.bigbacklog --out bench/compare/big-backlog.md

The drain (bench/drain.py: one `relay run`, default settings, backlog committed at once) and
the bulk-frame publish limit (bench/limits.py: the relay's BulkPublisher alone, no database,
3 x 500 in flight) both fill one durable queue that nobody consumes during the run, so a
broker that slows down as its queue grows slows both alike. Writes a Markdown report with the
machine, the command, the date and the load average before every run.
"""

from __future__ import annotations

from typing import Any

from bench.common import OneOff, load_before, one_off, one_off_env, wait_quiet
from bench.compare import _revision
from bench.drain import drain_once
from bench.limits import bulk_frame_limit
from bench.server import run_on_private_server


async def measure(sizes: list[int], quiet_below: float) -> list[dict[str, Any]]:
    """For each size: the broker's publish limit, then the relay's drain."""
    async with one_off_env("bigbacklog") as (env, records):
        for rows in sizes:
            for what in ("bulk-frame publish limit (no database)", "relay drain"):
                await wait_quiet(quiet_below)
                load = load_before()
                if what.startswith("relay"):
                    result = await drain_once(env, rows)
                else:
                    result = await bulk_frame_limit(env, rows)
                records.add({"what": what, "messages": rows,
                             "msg_per_s": round(result["msg_per_s"], 1),
                             "seconds": result["seconds"], "load_before": load,
                             "rabbitmq_cores": result.get("cpu_cores", {}).get("rabbitmq")})
    return records


def report(records: list[dict[str, Any]], run: OneOff) -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "A big backlog: the relay's drain beside the broker's own publish limit",
            f"build: {_revision()}",
            "PostgreSQL: a private initdb cluster with the server's defaults; RabbitMQ 3.10 on "
            "loopback, one durable classic queue nobody consumes during the run, persistent "
            "~200-byte messages"),
        "| what | messages | msg/s | seconds | RabbitMQ cores (drain) | load before |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(f"| {r['what']} | {r['messages']:,} | {r['msg_per_s']:,.0f} | "
                     f"{r['seconds']} | {r['rabbitmq_cores'] or '-'} | {r['load_before']} |")
    by = {(r["what"].split()[0], r["messages"]): r["msg_per_s"] for r in records}
    sizes = sorted({r["messages"] for r in records})
    lines += ["", "## Ratios (this run)", "", "| ratio | value |", "|---|---|"]
    for n in sizes:
        lines.append(f"| relay drain / publish limit, {n:,} | "
                     f"{by[('relay', n)] / by[('bulk-frame', n)]:.2f} |")
    small, big = sizes[0], sizes[-1]
    lines.append(f"| relay drain {big:,} / {small:,} | "
                 f"{by[('relay', big)] / by[('relay', small)]:.2f} |")
    lines.append(f"| publish limit {big:,} / {small:,} | "
                 f"{by[('bulk-frame', big)] / by[('bulk-frame', small)]:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run = one_off("bench.bigbacklog",
                        options={"--sizes": {"default": "100000,1000000"}})
    sizes = [int(x) for x in args.sizes.split(",")]
    records = run_on_private_server(lambda: measure(sizes, args.quiet_below))
    run.write(args.out, report(records, run))


if __name__ == "__main__":
    main()
