"""What one wake-up costs the database: statements (= round trips) per wake-up at a trickle,
and what idle relays cost, counted from PostgreSQL's own statement log.

    python -m bench.wakeup_trace --server-log /var/log/postgresql/postgresql-15-main.log

The scenario's private database gets `log_statement = all` (ALTER DATABASE: its sessions
only), so the shared server logs every statement of the relays and the producer. Then:

1. idle: N relays (1, then 2) on an empty table for --idle-s seconds: statements per second
   per relay process, by session (worker pool, wake-up gate, LISTEN);
2. trickle: one relay, one 1-row commit every --gap-ms: per wake-up, the relay's statements
   from the producer's INSERT up to the COMMIT of the DELETE (the round trips on the path
   to the consumer and the delete) and after it (going back to sleep).

Prints a JSON report (and writes it with --out). Needs read access to the server log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench import common
from bench.common import (
    RELAY_SRC,
    ROUTING_KEY,
    Relay,
    create_env,
    drop_env,
    load_before,
    machine,
)

LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] \S+@(\S+) LOG:  (?:statement|execute [^:]*): (.*)$")


def _statement_kind(sql: str) -> str:
    """A short name for a logged statement (comment lines dropped)."""
    text = " ".join(" ".join(x for x in sql.split("\t") if not x.strip().startswith("--"))
                    .split())
    for marker, name in (
        ("pg_advisory_unlock_all(); CLOSE ALL", "pool_reset"),
        ("pg_advisory_unlock", "wakeup_release"), ("+ 1, ", "wakeup_role"),
        ("pg_try_advisory_lock(", "wakeup_try_lock"), ("pg_advisory_lock(", "wakeup_lock"),
        ("EXISTS (SELECT 1 FROM", "wakeup_check"),
        ("min(available_at)", "seconds_until_next_due"), ("FOR UPDATE SKIP LOCKED", "claim"),
        ("::uuid[]); COMMIT", "delete_published_and_commit"), ("DELETE FROM", "delete_published"),
        ("INSERT INTO queue_message", "producer_insert"), ("LISTEN", "listen"),
    ):
        if marker in text:
            return name
    return text.split()[0].rstrip(";").upper() if text else "?"


def read_log(path: Path, offset: int, database: str) -> list[tuple[int, str]]:
    """(pid, statement kind) of every statement logged for `database` after `offset`
    (a statement's continuation lines start with a tab)."""
    with path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    entries: list[tuple[int, str]] = []
    current: list[str] | None = None
    pid = 0
    for line in text.splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line)
            continue
        if current is not None:
            entries.append((pid, _statement_kind(" ".join(current))))
            current = None
        m = LINE.match(line)
        if m and m.group(2) == database:
            pid, current = int(m.group(1)), [m.group(3)]
    if current is not None:
        entries.append((pid, _statement_kind(" ".join(current))))
    return entries


def _size(path: Path) -> int:
    """Where the server log ends now."""
    return path.stat().st_size


async def _sessions(dsn: str) -> dict[int, str]:
    """pid -> relay session role (worker, wakeup, listener) for this database."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = "
            "current_database() AND application_name LIKE 'outbox-relay %'")
    finally:
        await conn.close()
    names = {r["pid"]: r["application_name"].split() for r in rows}
    return {pid: f"{n[1]} {n[-1]}" for pid, n in names.items()}


async def idle(env: Any, log: Path, relays: int, seconds: float) -> dict[str, Any]:
    """Statements per second per relay while N relays idle on an empty table."""
    procs = [Relay(env.relay_env(), Path(tempfile.mkdtemp()) / "relay.log")
             for _ in range(relays)]
    try:
        for r in procs:
            await r.wait_started()
        await asyncio.sleep(2.0)  # start-up sweeps and role decisions are not idling
        roles = await _sessions(env.dsn)
        offset = _size(log)
        await asyncio.sleep(seconds)
        lines = read_log(log, offset, env.database)
        roles.update(await _sessions(env.dsn))
    finally:
        for r in procs:
            r.stop()
    pids = {p: collections.Counter[str]() for p in roles}
    for pid, kind in lines:
        if pid in pids:
            pids[pid][kind] += 1
    per_session = [{"session": roles[p], "statements_per_s": round(sum(c.values()) / seconds, 2),
                    "kinds": dict(c)} for p, c in pids.items() if c]
    per_relay: dict[str, collections.Counter[str]] = {}
    for p, c in pids.items():
        per_relay.setdefault(roles[p].split()[-1], collections.Counter()).update(c)
    processes = [{"relay_pid": k, "statements_per_s": round(sum(c.values()) / seconds, 2),
                  "sweeps_per_s": round(c["BEGIN"] / seconds, 2),
                  "role": "sleeper" if c["wakeup_check"] else "waiter"}
                 for k, c in per_relay.items()]
    total = sum(sum(c.values()) for c in pids.values())
    return {"relays": relays, "seconds": seconds,
            "statements_per_s_per_relay": round(total / seconds / relays, 2),
            "relay_processes": processes, "sessions": per_session}


async def trickle(env: Any, log: Path, commits: int, gap_ms: float) -> dict[str, Any]:
    """Statements per wake-up: one relay, one 1-row commit every gap_ms."""
    relay = Relay(env.relay_env(), Path(tempfile.mkdtemp()) / "relay.log")
    producer = await asyncpg.connect(env.dsn)
    try:
        await relay.wait_started()
        await asyncio.sleep(2.0)
        producer_pid = await producer.fetchval("SELECT pg_backend_pid()")
        roles = await _sessions(env.dsn)
        offset = _size(log)
        for _ in range(commits):
            await producer.execute(
                "INSERT INTO queue_message (exchange, routing_key, content) "
                "VALUES ($1, $2, '{\"n\": 1}')", env.exchange, ROUTING_KEY)
            await asyncio.sleep(gap_ms / 1000)
        lines = read_log(log, offset, env.database)
    finally:
        relay.stop()
        await producer.close()
    cycles: list[list[tuple[str, str]]] = []
    for pid, kind in lines:
        if pid == producer_pid and kind == "producer_insert":
            cycles.append([])
        elif cycles and pid in roles:
            cycles[-1].append((roles[pid].split()[0], kind))
    to_commit, after = [], []
    for cycle in cycles:
        kinds = [k for _, k in cycle]
        cut = next((i for i, k in enumerate(kinds) if k == "delete_published_and_commit"
                    or (k == "COMMIT" and "delete_published" in kinds[:i])), len(kinds) - 1)
        to_commit.append(cycle[: cut + 1])
        after.append(cycle[cut + 1:])

    def typical(parts: list[list[tuple[str, str]]]) -> dict[str, Any]:
        counts = sorted(len(p) for p in parts)
        common = collections.Counter(tuple(f"{s}:{k}" for s, k in p) for p in parts
                                     ).most_common(1)
        return {"median_statements": counts[len(counts) // 2], "min": counts[0],
                "max": counts[-1], "most_common_sequence": list(common[0][0]) if common else []}

    return {"commits": commits, "gap_ms": gap_ms, "wake_ups_seen": len(cycles),
            "insert_to_delete_commit": typical(to_commit), "after_commit": typical(after)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """Both scenarios on one private database with statement logging."""
    env = await create_env("trace")
    try:
        admin = await asyncpg.connect(common.PG_ADMIN_DSN)
        try:
            await admin.execute(f'ALTER DATABASE "{env.database}" SET log_statement = \'all\'')
        finally:
            await admin.close()
        report: dict[str, Any] = {"load_before": load_before()}
        report["idle"] = [await idle(env, args.server_log, n, args.idle_s) for n in (1, 2)]
        report["trickle"] = await trickle(env, args.server_log, args.commits, args.gap_ms)
    finally:
        await drop_env(env)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup_trace", description=__doc__)
    parser.add_argument("--server-log", type=Path, required=True)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--commits", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=100.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--label", default="", help="e.g. before / after")
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    result = {"label": ns.label, "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "command": "python -m bench.wakeup_trace " + " ".join(sys.argv[1:]),
              "relay_source": RELAY_SRC or "this checkout", "machine": machine(), **result}
    text = json.dumps(result, indent=1)
    print(text)
    if ns.out:
        ns.out.write_text(text + "\n")
