"""Commit-to-consumer latency of one build on two PostgreSQL servers, back to back: the
machine's shared server and a fresh private initdb cluster with the server's defaults.

    python -m bench.latency_servers --rates 1000:4,3000:16 --runs 3 \
        --out bench/compare/latency-servers.md

Runs alternate servers (shared, private, shared, private...), each on a fresh database with
the default notify mode, a CHECKPOINT before each run (bench/latency.py). Writes a Markdown
report with the machine, the command, the date and the load average before every run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from bench import common
from bench.common import create_env, drop_env, load_before, report_header, wait_quiet
from bench.compare import _revision
from bench.latency import latency_once
from bench.server import private_server


async def _one_run(server: str, rate: int, connections: int, *, seconds: float,
                   quiet_below: float, run: int) -> dict[str, Any]:
    env = await create_env("latsrv")
    try:
        await wait_quiet(quiet_below)
        result = await latency_once(env, rate, seconds, connections=connections)
    finally:
        await drop_env(env)
    record = {"server": server, "run": run, "rate": rate, "connections": connections, **result}
    print(json.dumps(record), flush=True)
    return record


def measure(rates: list[tuple[int, int]], runs: int, seconds: float,
            quiet_below: float) -> list[dict[str, Any]]:
    """Alternate the servers for every rate and run."""
    shared = common.PG_ADMIN_DSN
    records = []
    with private_server() as private:
        for rate, connections in rates:
            for i in range(runs):
                for server, dsn in (("shared", shared), ("private", private)):
                    common.use_server(dsn)
                    records.append(uvloop.run(_one_run(
                        server, rate, connections, seconds=seconds, quiet_below=quiet_below,
                        run=i + 1)))
    common.use_server(shared)
    return records


def report(records: list[dict[str, Any]], command: str, started: str,
           load: list[float]) -> str:
    """The Markdown results file."""
    lines = [
        *report_header(
            "Latency of one build on the shared server and on a fresh private cluster",
            "bench/latency_servers.py", command, started, load, f"build: {_revision()}",
            "shared: this machine's PostgreSQL 15 (autovacuum off, otherwise defaults); "
            "private: a fresh initdb cluster with every default; default relay settings, "
            "default notify mode, a fresh database per run"),
        "| server | commits/s | connections | run | p50 ms | p95 ms | p99 ms | reached | "
        "load before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(f"| {r['server']} | {r['rate']} | {r['connections']} | {r['run']} | "
                     f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['achieved_per_s']} "
                     f"| {r['load_before']} |")
    lines += ["", "## Medians", "", "| commits/s | server | p50 ms | p99 ms |",
              "|---|---|---|---|"]
    for rate in sorted({r["rate"] for r in records}):
        for server in ("shared", "private"):
            mine = [r for r in records if r["rate"] == rate and r["server"] == server]
            lines.append(f"| {rate} | {server} | "
                         f"{statistics.median(r['p50_ms'] for r in mine):.2f} | "
                         f"{statistics.median(r['p99_ms'] for r in mine):.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run, write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.latency_servers")
    parser.add_argument("--rates", default="1000:4,3000:16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quiet-below", type=float, default=1.0)
    args = parser.parse_args()
    rates = [(int(a), int(b)) for a, b in (x.split(":") for x in args.rates.split(","))]
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load = load_before()
    records = measure(rates, args.runs, args.seconds, args.quiet_below)
    command = "python -m bench.latency_servers " + shlex.join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(records, command, started, load))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
