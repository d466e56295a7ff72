"""What a trigger costs a bulk insert: one 100,000-row INSERT ... SELECT into the outbox with no
trigger, with the relay's statement-level trigger (`always`: one NOTIFY per statement), and with
the classic per-row trigger (one NOTIFY per row, the row id as payload). Runs alternate.
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg

from bench.common import NAMES, BenchEnv, insert_backlog, load_before, set_mode
from relay.settings import NotifyMode

PER_ROW = """
CREATE OR REPLACE FUNCTION bench_notify_row() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{channel}', NEW.id::text);
    RETURN NULL;
END
$fn$;
CREATE TRIGGER bench_notify_row AFTER INSERT ON queue_message
    FOR EACH ROW EXECUTE FUNCTION bench_notify_row()
"""


async def _one(conn: asyncpg.Connection, env: BenchEnv, rows: int) -> float:
    started = time.monotonic()
    seconds = await insert_backlog(conn, env, rows) - started
    await conn.execute("TRUNCATE queue_message")
    return rows / seconds


async def trigger_costs(env: BenchEnv, rows: int, runs: int) -> list[dict[str, Any]]:
    """rows/s of a bulk insert under each trigger, `runs` alternating rounds (no relay)."""
    conn = await asyncpg.connect(env.dsn)
    out = []
    try:
        for r in range(runs):
            for kind in ("none", "statement", "per_row"):
                await set_mode(env, NotifyMode.OFF if kind != "statement"
                               else NotifyMode.ALWAYS)
                if kind == "per_row":
                    await conn.execute(PER_ROW.replace("{channel}", NAMES.channel))
                load = load_before()
                rate = await _one(conn, env, rows)
                if kind == "per_row":
                    await conn.execute("DROP TRIGGER bench_notify_row ON queue_message")
                out.append({"round": r + 1, "trigger": kind, "rows": rows,
                            "rows_per_s": round(rate), "load_before": load})
                print(out[-1], flush=True)
    finally:
        await conn.close()
    return out
