"""Drain throughput: N `relay run` processes empty a backlog committed in one transaction.

The relays start first and sleep on an empty table; the backlog is then committed at once,
so the figure runs from the commit (the NOTIFY wakes the relays) to the last delete.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import BenchEnv, Relay, cpu_split, insert_backlog, purge_queue, wait_drained


async def drain_once(
    env: BenchEnv,
    rows: int,
    *,
    processes: int = 1,
    batch_size: int = 500,
    concurrency: int = 3,
    publisher: str = "bulk",
    log_dir: Path | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """One drain of `rows` rows; msg/s and the CPU split while it ran."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-drain-"))
    overrides = {"batch_size": batch_size, "concurrency": concurrency, "publisher": publisher}
    relays = [
        Relay(env.relay_env(**overrides), log_dir / f"relay-{i}.log") for i in range(processes)
    ]
    conn = await asyncpg.connect(env.dsn)
    try:
        for relay in relays:
            await relay.wait_started()
        with cpu_split([r.proc.pid for r in relays]) as cpu:
            committed = await insert_backlog(conn, env, rows)
            emptied = await wait_drained(conn, env, rows, timeout_s)
        seconds = emptied - committed
        await conn.execute("VACUUM queue_message")
    finally:
        await conn.close()
        for relay in relays:
            relay.stop()
    await purge_queue(env)
    return {
        "rows": rows,
        "processes": processes,
        "batch_size": batch_size,
        "concurrency": concurrency,
        "publisher": publisher,
        "seconds": round(seconds, 3),
        "msg_per_s": round(rows / seconds, 1),
        "cpu_cores": cpu,
    }
