"""Producers spared: pgbench's commit rate under each notify mode's trigger, against none, while
relays work (docs/speed.md)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    NAMES,
    BenchEnv,
    insert_backlog,
    load_before,
    log_dir,
    relays,
    wait_empty,
)
from relay.settings import NotifyMode

PGBENCH_SQL = ("INSERT INTO queue_message (exchange, routing_key, content) "
               "VALUES ('{x}', 'rk', '{{\"n\": 1}}');\n")


def pgbench(dsn: str, script: Path, clients: int, seconds: float) -> float:
    """Commits per second of one pgbench run."""
    out = subprocess.run(["pgbench", "-n", "-f", str(script), "-c", str(clients), "-j", "2",
                          "-T", str(max(1, round(seconds))), dsn],
                         capture_output=True, text=True, check=True)
    match = re.search(r"tps = ([\d.]+)", out.stdout)
    if match is None:
        raise RuntimeError(out.stdout + out.stderr)
    return float(match.group(1))


async def producer_rounds(env: BenchEnv, *, situation: str, modes: tuple[NotifyMode, ...],
                          rounds: int, seconds: float, backlog_rows: int,
                          clients: int = 8) -> list[dict[str, Any]]:
    """`rounds` rounds of every mode (order reversed every other round), one record per run;
    NOTIFYs counted on a LISTEN connection (docs/speed.md: the two situations)."""
    script = log_dir("producers") / "insert.sql"
    script.write_text(PGBENCH_SQL.format(x=env.exchange))
    listen = await asyncpg.connect(env.dsn)
    notifies: list[object] = []
    await listen.add_listener(NAMES.channel, lambda *a: notifies.append(a))
    out: list[dict[str, Any]] = []
    try:
        async with relays(env, 1 if situation == "backlog" else 2, "producers",
                          poll_interval_s=0.5):
            for r in range(rounds):
                for mode in modes if r % 2 == 0 else tuple(reversed(modes)):
                    await env.set_mode(mode)
                    if situation == "backlog":
                        await insert_backlog(listen, env, backlog_rows)
                        await _wait_draining(listen, backlog_rows)
                    else:
                        await wait_empty(listen, 120)
                        await asyncio.sleep(0.5)  # the relays go to sleep
                    before, load = len(notifies), load_before()
                    tps = await asyncio.to_thread(pgbench, env.dsn, script, clients, seconds)
                    out.append({"situation": situation, "round": r + 1, "mode": mode.value,
                                "clients": clients, "tps": round(tps),
                                "notifications": len(notifies) - before, "load_before": load,
                                "rows_left": await listen.fetchval(
                                    "SELECT count(*) FROM queue_message")})
                    print(out[-1], flush=True)
                    await wait_empty(listen, 600)
                    await env.purge()
    finally:
        await listen.close()
    return out


async def _wait_draining(conn: asyncpg.Connection, rows: int, timeout_s: float = 30.0) -> None:
    """Until the relay has deleted rows of the backlog."""
    deadline = time.monotonic() + timeout_s
    while await conn.fetchval("SELECT count(*) FROM queue_message") >= rows:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the relay did not start draining within {timeout_s} s")
        await asyncio.sleep(0.1)
