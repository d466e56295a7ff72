"""Producers spared: pgbench commit rate with each notify mode's trigger, against no trigger.

8 pgbench clients (its own process) commit one 1-row INSERT per transaction for a few seconds
while `relay run` works, in two situations:

- backlog: one relay drains a backlog committed before the run (its batches come back full);
- live: two relays (the table's sleeper and a waiter) start on an empty table and follow the
  producers, sleeping whenever they catch up.

Rounds alternate the modes (the trigger switched on the live table by `migrate`; relays follow
it), so machine noise hits every mode alike; each round gives the ratio of a mode's commit rate
to no trigger (`off`) in that round. The median and spread of those ratios are the figure.
NOTIFYs are counted on a separate LISTEN connection.

Beside them, with no relay: what a trigger costs a bulk insert (`trigger_costs`): one
100,000-row INSERT ... SELECT into the outbox with no trigger, with the relay's statement-level
trigger (`always`: one NOTIFY per statement), and with the classic per-row trigger (one NOTIFY
per row, the row id as payload), runs alternating.

The relays poll every 0.5 s (RELAY_POLL_INTERVAL_S), and a backlog round starts only once the
relay drains: with no trigger nothing wakes a relay but its poll, and a relay that slept
through an `off` round left the producers the whole machine, so the ratio measured the
relay's drain competing for 2 cores, not what the trigger costs (backlog `conditional` 0.50
with the relay asleep in most `off` rounds, rows left 58,000-116,000 of an 80,000-row backlog).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    NAMES,
    BenchEnv,
    Relay,
    insert_backlog,
    load_before,
    purge_queue,
    set_mode,
    wait_empty,
)
from relay.settings import NotifyMode

INSERT = ("INSERT INTO queue_message (exchange, routing_key, content) "
          "VALUES ('{x}', 'rk', '{{\"n\": 1}}');\n")


def pgbench(dsn: str, script: Path, clients: int, seconds: float) -> float:
    """Commits per second of one pgbench run."""
    out = subprocess.run(
        ["pgbench", "-n", "-f", str(script), "-c", str(clients), "-j", "2",
         "-T", str(max(1, round(seconds))), dsn],
        capture_output=True, text=True, check=True,
    )
    match = re.search(r"tps = ([\d.]+)", out.stdout)
    if match is None:
        raise RuntimeError(out.stdout + out.stderr)
    return float(match.group(1))


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, *_: object) -> None:
        self.n += 1


async def producer_rounds(
    env: BenchEnv,
    *,
    situation: str,
    modes: tuple[NotifyMode, ...],
    rounds: int,
    seconds: float,
    clients: int = 8,
    backlog_rows: int = 150_000,
) -> list[dict[str, Any]]:
    """`rounds` rounds of every mode (order reversed every other round); one dict per run."""
    log_dir = Path(tempfile.mkdtemp(prefix="bench-producers-"))
    script = log_dir / "insert.sql"
    script.write_text(INSERT.format(x=env.exchange))
    relays = [Relay(env.relay_env(poll_interval_s=0.5), log_dir / f"relay-{i}.log")
              for i in range(1 if situation == "backlog" else 2)]
    listen = await asyncpg.connect(env.dsn)
    counter = _Counter()
    await listen.add_listener(NAMES.channel, counter)
    out: list[dict[str, Any]] = []
    try:
        for relay in relays:
            await relay.wait_started()
        for r in range(rounds):
            order = modes if r % 2 == 0 else tuple(reversed(modes))
            for mode in order:
                await set_mode(env, mode)
                if situation == "backlog":
                    await insert_backlog(listen, env, backlog_rows)
                    await _wait_draining(listen, backlog_rows)
                else:
                    await wait_empty(listen, 120)
                    await asyncio.sleep(0.5)  # the relays go to sleep
                before_notifies = counter.n
                load = load_before()
                tps = await asyncio.to_thread(pgbench, env.dsn, script, clients, seconds)
                left = await listen.fetchval("SELECT count(*) FROM queue_message")
                out.append({"situation": situation, "round": r + 1, "mode": mode.value,
                            "clients": clients, "tps": round(tps),
                            "notifications": counter.n - before_notifies,
                            "rows_left": left, "load_before": load})
                print(out[-1], flush=True)
                await wait_empty(listen, 600)
                await purge_queue(env)  # nothing consumes: keep the shared broker's memory low
    finally:
        await listen.close()
        for relay in relays:
            relay.stop()
    return out


async def _wait_draining(conn: asyncpg.Connection, backlog_rows: int,
                         timeout_s: float = 30.0) -> None:
    """Until the relay has deleted rows of the backlog (woken by the NOTIFY or its poll)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await conn.fetchval("SELECT count(*) FROM queue_message") >= backlog_rows:
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"the relay did not start draining within {timeout_s} s")
        await asyncio.sleep(0.1)


def ratios(runs: list[dict[str, Any]], mode: str) -> list[float]:
    """Per round: the mode's commit rate over no trigger's."""
    base = {r["round"]: r["tps"] for r in runs if r["mode"] == "off"}
    return [round(r["tps"] / base[r["round"]], 3) for r in runs
            if r["mode"] == mode and base.get(r["round"])]

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
