"""Commit-to-consumer latency of one build on two PostgreSQL servers, back to back: the
machine's shared server and a fresh private initdb cluster with the server's defaults.

    python -m bench.latency_servers --rates 1000:4,3000:16 --runs 3 \
        --out bench/compare/latency-servers.md

Runs alternate servers (shared, private, shared, private...), each on a fresh database with
the default notify mode, a CHECKPOINT before each run (bench/latency.py). Writes a Markdown
report with the machine, the command, the date and the load average before every run.
"""

from __future__ import annotations

import json
from typing import Any

import uvloop

from bench import common
from bench.common import OneOff, create_env, drop_env, one_off, wait_quiet
from bench.compare import _revision, latency_tables
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


def report(records: list[dict[str, Any]], run: OneOff) -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "Latency of one build on the shared server and on a fresh private cluster",
            f"build: {_revision()}",
            "shared: this machine's PostgreSQL 15 (autovacuum off, otherwise defaults); "
            "private: a fresh initdb cluster with every default; default relay settings, "
            "default notify mode, a fresh database per run"),
    ]
    lines += latency_tables(records, "server", ("shared", "private"))
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run, write the report."""
    args, run = one_off("bench.latency_servers", rates="1000:4,3000:16", runs=3, seconds=10.0)
    records = measure(args.rates, args.runs, args.seconds, args.quiet_below)
    run.write(args.out, report(records, run))


if __name__ == "__main__":
    main()
