"""Drain throughput: N `relay run` processes empty a backlog committed in one transaction.

The relays start first and sleep on an empty table; the backlog is then committed at once,
so the figure runs from the commit (the NOTIFY wakes the relays) to the last delete.

CPU while it ran, from /proc: the relay processes; PostgreSQL's backends serving this
scenario's database (the relays' sessions: the work the relay causes, without the server's
shared background writers); every postgres process and the RabbitMQ node (beam.smp), which
include whatever else the machine runs; and the whole machine.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    BenchEnv,
    Relay,
    cpu_s,
    cpu_split,
    insert_backlog,
    load_before,
    purge_queue,
    wait_drained,
)


async def _backends(conn: asyncpg.Connection) -> set[int]:
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                            " AND pid <> pg_backend_pid()")
    return {int(r["pid"]) for r in rows}


async def drain_once(
    env: BenchEnv,
    rows: int,
    *,
    processes: int = 1,
    batch_size: int = 500,
    concurrency: int = 3,
    publisher: str = "bulk",
    log_dir: Path | None = None,
    timeout_s: float = 900.0,
    pinned: bool = False,
    extra_env: dict[str, str] | None = None,
    options_sql: str = "NULL",
) -> dict[str, Any]:
    """One drain of `rows` rows; msg/s and the CPU used while it ran.

    pinned: another session holds a REPEATABLE READ snapshot taken before the backlog's
    insert until the drain ends (a report, a stuck session): the xmin horizon stays behind
    every delete, so no deleted row can be cleaned up while the relay drains.
    extra_env: more environment of the relays (OTEL_* variables); options_sql: the rows'
    options (bench/common.py insert_backlog)."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-drain-"))
    overrides = {"batch_size": batch_size, "concurrency": concurrency, "publisher": publisher}
    relays = [
        Relay({**env.relay_env(**overrides), **(extra_env or {})}, log_dir / f"relay-{i}.log")
        for i in range(processes)
    ]
    conn = await asyncpg.connect(env.dsn)
    holder = await asyncpg.connect(env.dsn)
    try:
        if pinned:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM queue_message")
        for relay in relays:
            await relay.wait_started()
        load = load_before()
        own0 = {p: cpu_s(p) for p in await _backends(conn)}
        with cpu_split([r.proc.pid for r in relays]) as cpu:
            committed = await insert_backlog(conn, env, rows, options_sql)
            emptied = await wait_drained(conn, env, rows, timeout_s)
        own_pids = set(own0) | await _backends(conn)
        own_cpu = sum(cpu_s(p) - own0.get(p, 0.0) for p in own_pids)
        seconds = emptied - committed
        await holder.close()
        await conn.execute("VACUUM queue_message")
    finally:
        await holder.close()
        await conn.close()
        for relay in relays:
            relay.stop()
    await purge_queue(env)
    # The insert itself is inside the CPU window (its backend is the scenario's too), so the
    # window is a little longer than the drain; per-message CPU uses the window's length.
    window_s = cpu.pop("window_s")
    per_1k = {k: round(v * window_s / rows * 1000, 4) for k, v in cpu.items()
              if k not in ("machine_busy", "other")}
    per_1k["postgres_own_sessions"] = round(own_cpu / rows * 1000, 4)
    return {
        "rows": rows,
        "processes": processes,
        "batch_size": batch_size,
        "concurrency": concurrency,
        "publisher": publisher,
        "pinned": pinned,
        "seconds": round(seconds, 3),
        "msg_per_s": round(rows / seconds, 1),
        "cpu_cores": cpu,
        "cpu_s_per_1k_msgs": per_1k,
        "load_before": load,
    }
