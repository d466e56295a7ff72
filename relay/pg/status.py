"""What `relay status` (and the status page) shows: one sample of the table's state, and the
rates and ETA between two samples."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from relay.backoff import jittered_delay_s
from relay.errors import DatabaseError, SchemaError
from relay.pg.config import DatabaseConfig
from relay.pg.connection import DB_ERRORS, session, translated
from relay.pg.queries import Queries
from relay.pg.schema import require_current

log = structlog.get_logger("relay.pg.status")


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


async def backlog_figures(conn: Any, q: Queries) -> dict[str, Any]:
    """The backlog's counts and ages, dead letters and the table's health: the figures that
    `relay status`, the status page and the metrics all show, read one way. `conn`: a
    connection or a pool. Driver errors are the caller's."""
    backlog = await conn.fetchrow(q["backlog"])
    dead = await conn.fetchval(q["dead_count"])
    health = await conn.fetchrow(q["table_health"])
    figures: dict[str, Any] = dict(backlog) if backlog else {}
    figures["dead"] = int(dead)
    figures["dead_tuples"] = health["n_dead_tup"] if health else None
    figures["last_vacuum_age_s"] = health["vacuum_age_s"] if health else None
    # Rows for RabbitMQ streams (docs/streams.md), waiting in their own table, and parked.
    figures.update(dict(await conn.fetchrow(q["stream_status"])))
    return figures


class StatusReader:
    """Reads samples over one connection (a pooled one or a plain one)."""

    def __init__(self, conn: Any, queries: Queries) -> None:
        self._conn = conn
        self.q = queries

    async def sample(self) -> Sample:
        """Backlog, dead letters by reason, table health, traffic counters, relays, notify."""
        q, conn = self.q, self._conn
        with translated("reading the status"):
            figures = await backlog_figures(conn, q)
            traffic = await conn.fetchrow(q["table_traffic"])
            reasons = await conn.fetch(q["dead_by_reason"])
            relays = await conn.fetchval(q["relay_sessions"])
            notify = await conn.fetchval(q["notify_mode"])
            parts = await conn.fetch(q["archive_partition_list"])
        figures.update(dict(traffic) if traffic else {"inserted_total": 0, "removed_total": 0})
        by_reason = {r["reason"]: int(r["n"]) for r in reasons}
        figures["relays"] = int(relays)
        figures["notify_mode"] = notify
        # A partitioned archive's partitions, oldest first (none when it is not partitioned).
        figures["archive_partitions"] = [
            {"name": p["name"], "bounds": p["bounds"].removeprefix("FOR VALUES "),
             "bytes": int(p["bytes"]), "rows": int(p["rows"])} for p in parts]
        return Sample(time.monotonic(), figures, by_reason)


@contextlib.asynccontextmanager
async def open_status(db: DatabaseConfig) -> AsyncIterator[StatusReader]:
    """A reader of the table's status over a session of its own (`relay status`); the table
    must exist and its schema be current."""
    async with session(db, "status") as conn:
        q = db.queries
        if not await conn.fetchval(q["table_exists"]):
            raise SchemaError(f"table {db.table} does not exist: run `relay migrate` first")
        await require_current(conn, q, db.table)
        yield StatusReader(conn, q)


def document(table: str, sample: Sample, before: Sample | None) -> dict[str, Any]:
    """One status as a JSON-able document (the CLI and the status page show this)."""
    figures = {k: v for k, v in sample.figures.items()
               if k not in {"inserted_total", "removed_total"}}
    return {"table": table, **figures, **rates(before, sample),
            "dead_by_reason": sample.dead_by_reason}


class StatusSource:
    """Status documents for the status page of a running relay.

    Its own connection, opened at the first request (a relay nobody looks at pays nothing)
    and reopened after an error; samples are reused for `min_interval_s`, so a page that
    refreshes, or several viewers, cost one sample per interval. After a failure the next
    attempt waits (1 s, doubling up to `max_backoff_s`): meanwhile every request gets the
    same failure at once, so a page polled while the database is down costs no logins.
    """

    def __init__(self, connect: Callable[[], Awaitable[Any]], queries: Queries, table: str,
                 min_interval_s: float = 2.0, max_backoff_s: float = 30.0) -> None:
        self._connect = connect
        self._q = queries
        self._table = table
        self._min_interval_s = min_interval_s
        self._max_backoff_s = max_backoff_s
        self._conn: Any = None
        self._samples: list[Sample] = []  # the last two
        self._lock = asyncio.Lock()
        self._failures = 0
        self._failed: DatabaseError | None = None
        self._retry_at = 0.0

    async def document(self) -> dict[str, Any]:
        """The latest status (rates against the sample before); DatabaseError when down."""
        async with self._lock:
            last = self._samples[-1] if self._samples else None
            if last is None or time.monotonic() - last.at >= self._min_interval_s:
                await self._sample()
            before = self._samples[-2] if len(self._samples) > 1 else None
            return document(self._table, self._samples[-1], before)

    async def _sample(self) -> None:
        if self._failed is not None and time.monotonic() < self._retry_at:
            raise self._failed
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await self._connect()
            sample = await StatusReader(self._conn, self._q).sample()
        except DatabaseError as exc:
            await self.close()
            self._failed = exc
            self._retry_at = time.monotonic() + jittered_delay_s(
                1.0, self._max_backoff_s, self._failures)
            self._failures += 1
            log.warning("status_unreadable", error=str(exc))
            raise
        self._failed, self._failures = None, 0
        self._samples = [*self._samples[-1:], sample]

    async def close(self) -> None:
        """Close the connection (safe to call twice)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*DB_ERRORS):
                await conn.close()
