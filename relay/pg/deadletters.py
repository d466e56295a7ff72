"""Dead letters and retention: list, show, replay and purge dead letters; prune the archive.

The logic behind `relay dead ...` and `relay prune`; the CLI only parses arguments and prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from relay.errors import DatabaseError, RelayError
from relay.pg.queries import Queries
from relay.pg.store import DB_ERRORS

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")

DEFAULT_BATCH_ROWS = 1000


class UsageError(RelayError):
    """A command-line argument is invalid."""


def parse_duration_s(text: str) -> float:
    """'7d', '12h', '30m', '45s', '2w' or plain seconds -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"invalid duration {text!r}: use a number with s, m, h, d or w (7d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def check_ids(ids: list[str]) -> list[str]:
    """Reject anything that is not a UUID before it reaches the database."""
    bad = [i for i in ids if not _UUID.match(i)]
    if bad:
        raise UsageError(f"not a row id (UUID): {', '.join(bad)}")
    return ids


@dataclass
class ReplayResult:
    """What `dead replay` did: ids moved back into the outbox, and rows it had to leave."""

    replayed: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)  # id, why


class DeadLetters:
    """Operations on <table>_dead and <table>_archive over one connection."""

    def __init__(self, conn: asyncpg.Connection, queries: Queries) -> None:
        self._conn = conn
        self.q = queries

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return list(await self._conn.fetch(self.q[name], *args))
        except DB_ERRORS as exc:
            raise DatabaseError(f"{name} failed: {exc}") from exc

    async def _execute(self, name: str, *args: Any) -> int:
        try:
            status = await self._conn.execute(self.q[name], *args)
        except DB_ERRORS as exc:
            raise DatabaseError(f"{name} failed: {exc}") from exc
        # "DELETE 42" -> 42
        return int(status.rsplit(" ", 1)[-1])

    async def listing(self, *, limit: int = 100, reason: str | None = None) -> list[dict[str, Any]]:
        """Dead letters, oldest first (optionally only those whose reason contains `reason`)."""
        return [dict(r) for r in await self._fetch("dead_list", reason, limit)]

    async def show(self, row_id: str) -> dict[str, Any] | None:
        """Every column of one dead letter, or None."""
        rows = await self._fetch("dead_show", check_ids([row_id])[0])
        return dict(rows[0]) if rows else None

    async def replay(
        self,
        *,
        ids: list[str] | None = None,
        reason: str | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> ReplayResult:
        """Move matching dead letters back into the outbox (original id, attempts reset).

        ids=None and reason=None replays every dead letter. Works in batches of `batch_rows`,
        one transaction each; the insert trigger wakes the relays.
        """
        id_arg = check_ids(ids) if ids else None
        result = ReplayResult()
        while True:
            moved = await self._fetch("dead_replay", id_arg, reason, batch_rows)
            result.replayed.extend(r[0] for r in moved)
            if len(moved) < batch_rows:
                break
        left = await self._fetch("dead_unreplayable", id_arg, reason)
        result.left = [(r["id"], r["why"]) for r in left]
        return result

    async def purge(
        self, *, older_than_s: float | None = None, batch_rows: int = 10_000
    ) -> int:
        """Delete dead letters (all, or those dead for longer than `older_than_s`)."""
        total = 0
        while True:
            n = await self._execute("dead_purge", older_than_s, batch_rows)
            total += n
            if n < batch_rows:
                return total

    async def prune_archive(self, *, older_than_s: float, batch_rows: int = 10_000) -> int:
        """Delete archived rows published more than `older_than_s` ago, in bounded batches."""
        total = 0
        while True:
            n = await self._execute("archive_prune", older_than_s, batch_rows)
            total += n
            if n < batch_rows:
                return total
