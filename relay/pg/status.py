"""What `relay status` (and the status page) shows: one sample of the table's state, and the
rates and ETA between two samples."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from relay.errors import DatabaseError
from relay.pg.queries import Queries
from relay.pg.store import DB_ERRORS


@dataclass
class Sample:
    """The outbox at one moment."""

    at: float  # time.monotonic()
    figures: dict[str, Any]
    dead_by_reason: dict[str, int] = field(default_factory=dict)


def rates(before: Sample | None, now: Sample) -> dict[str, float | None]:
    """Rows in and out per second between two samples, and the ETA of an empty backlog."""
    if before is None or now.at <= before.at:
        return {"in_per_s": None, "out_per_s": None, "eta_s": None}
    dt = now.at - before.at
    rate_in = max(now.figures["inserted_total"] - before.figures["inserted_total"], 0) / dt
    rate_out = max(now.figures["removed_total"] - before.figures["removed_total"], 0) / dt
    due = now.figures["due"]
    drain = rate_out - rate_in
    eta = 0.0 if due == 0 else (due / drain if drain > 0 else None)
    return {"in_per_s": round(rate_in, 1), "out_per_s": round(rate_out, 1),
            "eta_s": None if eta is None else round(eta, 1)}


class StatusReader:
    """Reads samples over one connection (a pooled one or a plain one)."""

    def __init__(self, conn: Any, queries: Queries) -> None:
        self._conn = conn
        self.q = queries

    async def sample(self) -> Sample:
        """Backlog, dead letters by reason, table health, traffic counters, relays, notify."""
        q, conn = self.q, self._conn
        try:
            backlog = await conn.fetchrow(q["backlog"])
            traffic = await conn.fetchrow(q["table_traffic"])
            health = await conn.fetchrow(q["table_health"])
            reasons = await conn.fetch(q["dead_by_reason"])
            relays = await conn.fetchval(q["relay_sessions"])
            dead = await conn.fetchval(q["dead_count"])
            notify = await conn.fetchval(q["notify_mode"])
        except DB_ERRORS as exc:
            raise DatabaseError(f"reading the status failed: {exc}") from exc
        figures: dict[str, Any] = dict(backlog) if backlog else {}
        figures.update(dict(traffic) if traffic else {"inserted_total": 0, "removed_total": 0})
        by_reason = {r["reason"]: int(r["n"]) for r in reasons}
        figures["dead"] = int(dead)
        figures["dead_tuples"] = health["n_dead_tup"] if health else None
        figures["last_vacuum_age_s"] = health["vacuum_age_s"] if health else None
        figures["relays"] = int(relays)
        figures["notify_mode"] = notify
        return Sample(time.monotonic(), figures, by_reason)
