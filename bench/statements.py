"""Where the database's time goes per message, by statement, with 1 and N relays: drains of
--drain-rows on a private cluster with the server's defaults and pg_stat_statements loaded;
per 1,000 messages, each statement's execution time and the buffers it touched (a locked row a
claim skips is still read: buffer hits count the rows walked, whatever the machine's load;
statements are listed by the buffers they touched, a wait for a lock touches none)."""

from __future__ import annotations

import argparse
from typing import Any

import asyncpg

from bench import common
from bench.drain import drain_once

TOP = 8
STATEMENTS = """
SELECT calls, total_exec_time AS ms, rows, shared_blks_hit + shared_blks_read AS buffers,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 70) AS query
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY shared_blks_hit + shared_blks_read DESC, total_exec_time DESC
"""


def options(parser: argparse.ArgumentParser) -> None:
    """This scenario's own options."""
    parser.add_argument("--drain-rows", type=int, default=100_000)
    parser.add_argument("--relays", default="1,4", help="relay processes of each drain: 1,4")


async def _drains(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    async with common.scenario_env("statements") as env:
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            for relays in map(int, args.relays.split(",")):
                await common.wait_quiet(args.quiet_below)
                await conn.execute("SELECT pg_stat_statements_reset()")
                result = await drain_once(env, args.drain_rows, processes=relays)
                rows = [dict(r) for r in await conn.fetch(STATEMENTS)]
                out.append({"relays": relays, **result, "statements": rows})
                print({k: v for k, v in out[-1].items() if k != "statements"}, flush=True)
        finally:
            await conn.close()
    return out


def report(drains: list[dict[str, Any]], rows: int) -> list[str]:
    """Each drain's rate and CPU, then its costliest statements per 1,000 messages."""
    per_1k = 1000 / rows
    lines = ["| relays | msg/s | CPU ms per 1,000 msgs: PostgreSQL (its sessions) / relays "
             "| load before |", "|---|---|---|---|"]
    for d in drains:
        cpu = d["cpu_s_per_1k_msgs"]
        lines.append(f"| {d['relays']} | {d['msg_per_s']:,.0f} | "
                     f"{cpu['postgres_own_sessions'] * 1000:.1f} / {cpu['relay'] * 1000:.1f} | "
                     f"{d['load_before'][0]} |")
    for d in drains:
        lines += ["", f"Statements with {d['relays']} relay(s), per 1,000 messages "
                      f"(execution time includes waiting for a CPU):", "",
                  "| statement | calls | exec ms | buffers | rows |", "|---|---|---|---|---|"]
        for s in d["statements"][:TOP]:
            lines.append(f"| `{s['query'].replace('|', '/')}` | {s['calls'] * per_1k:.1f} | "
                         f"{s['ms'] * per_1k:.2f} | {s['buffers'] * per_1k:,.0f} | "
                         f"{s['rows'] * per_1k:,.0f} |")
    return lines


def measure(args: argparse.Namespace) -> tuple[str, list[str], list[str]]:
    """Run the drains; the report's title, details and body."""
    settings = {"shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track": "all"}
    with common.private_server(settings):
        drains = common.run(lambda: _drains(args))
    return ("Where the database's time goes, by statement", [
        f"rows per drain: {args.drain_rows:,}; relays: {args.relays}",
        f"notify mode: {common.DEFAULT_MODE.value} (the default); default relay settings"],
        report(drains, args.drain_rows))
