"""Dead letters and retention: list, show, replay and purge dead letters; prune the archive.

The logic behind `relay dead ...` and `relay prune`; the CLI only parses arguments and prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg

from relay.errors import DatabaseError, RelayError
from relay.pg.config import DatabaseConfig
from relay.pg.connection import DB_ERRORS, session
from relay.pg.queries import Queries

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


def reason_code(reason: str | None) -> str | None:
    """A reason filter as the statements take it: a reason's code (the text before the first
    ':' of a dead letter's reason, as the status page groups them), matched exactly. Text with
    a ':' in it is refused: a filter that matched inside reasons' texts once took letters of
    other reasons with it (a purge of `internal` deleted those naming `billing-internal`)."""
    if reason is None:
        return None
    code = reason.strip()
    if not code or ":" in code:
        raise UsageError(f"reason: a reason code, the text before ':' in a dead letter's reason "
                         f"(unroutable, too_large, ...; `relay status` lists them), not {reason!r}")
    return code


@dataclass(frozen=True)
class Filter:
    """Which dead letters an operation touches: ids, a reason code, a minimum age, a limit."""

    ids: list[str] | None = None
    reason: str | None = None
    older_than_s: float | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.ids:
            check_ids(self.ids)
        object.__setattr__(self, "reason", reason_code(self.reason))
        if self.limit is not None and self.limit < 1:
            raise UsageError("--limit must be at least 1")

    @property
    def narrows(self) -> bool:
        """True when some filter is set (purge without one needs --all)."""
        return bool(self.ids or self.reason or self.older_than_s is not None)

    def args(self) -> tuple[Any, ...]:
        """The ($1, $2, $3) of dead_count_matching and dead_snapshot."""
        return (self.ids or None, self.reason, self.older_than_s)


Progress = Callable[[int, int], None]  # (done, total)
_T = TypeVar("_T")


def _slices(items: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class DeadLetters:
    """Operations on <table>_dead and <table>_archive over one connection."""

    def __init__(self, conn: asyncpg.Connection, queries: Queries) -> None:
        self._conn = conn
        self.q = queries

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return list(await self._conn.fetch(self.q[name], *args))
        except DB_ERRORS as exc:
            raise DatabaseError(f"{name} failed: {exc or type(exc).__name__}") from exc

    async def _execute(self, name: str, *args: Any) -> int:
        try:
            status = await self._conn.execute(self.q[name], *args)
        except DB_ERRORS as exc:
            raise DatabaseError(f"{name} failed: {exc or type(exc).__name__}") from exc
        # "DELETE 42" -> 42
        return int(status.rsplit(" ", 1)[-1])

    async def count(self, which: Filter) -> int:
        """How many dead letters match (ignoring the limit)."""
        return int((await self._fetch("dead_count_matching", *which.args()))[0][0])

    async def snapshot(self, which: Filter) -> list[str]:
        """The ids an operation will touch, fixed now, oldest first."""
        rows = await self._fetch("dead_snapshot", *which.args(), which.limit)
        return [r[0] for r in rows]

    async def snapshot_keys(self, which: Filter) -> list[int]:
        """The dead letters a purge will delete, by their own key, fixed now, oldest first."""
        rows = await self._fetch("dead_snapshot_keys", *which.args(), which.limit)
        return [int(r[0]) for r in rows]

    async def listing(self, *, limit: int = 100, reason: str | None = None) -> list[dict[str, Any]]:
        """Dead letters, oldest first (optionally only those of one reason code)."""
        return [dict(r) for r in await self._fetch("dead_list", reason_code(reason), limit)]

    async def stream_listing(self, *, limit: int = 100,
                             reason: str | None = None) -> list[dict[str, Any]]:
        """Parked stream rows (<table>_stream_dead), oldest first."""
        return [dict(r) for r in await self._fetch("stream_dead_list", reason_code(reason),
                                                   limit)]

    async def stream_replay(self, ids: list[str] | None, reason: str | None) -> list[str]:
        """Move parked stream rows back into the stream table, in one transaction: these ids
        (None: every one), only those of one reason code; the ids moved."""
        if ids is not None:
            check_ids(ids)
        code = reason_code(reason)
        if code is not None:
            of_reason = [r[0] for r in await self._fetch("stream_dead_ids", code)]
            ids = of_reason if ids is None else [i for i in ids if i.lower() in of_reason]
            if not ids:
                return []
        rows = await self._fetch("stream_dead_replay", ids)
        return [r[0] for r in rows]

    async def show(self, row_id: str, *, content_chars: int | None = None) -> list[dict[str, Any]]:
        """Every column of each dead letter with this id, the latest first (an id a producer
        reused can have been parked more than once); empty when there is none. The content cut
        to `content_chars` characters (None: whole), with `content_bytes` (its whole size) and
        `content_cut`."""
        return [dict(r) for r in await self._fetch("dead_show", check_ids([row_id])[0],
                                                   content_chars)]

    async def replay(self, ids: list[str], *, batch_rows: int = DEFAULT_BATCH_ROWS,
                     progress: Progress | None = None) -> ReplayResult:
        """Move these dead letters (a snapshot) back into the outbox, original id, attempts reset.

        Of an id parked more than once, the latest dead letter moves; the older ones stay and
        are reported in `left`.

        One transaction per `batch_rows`; the insert trigger wakes the relays. A row that dies
        again meanwhile is not in the snapshot twice, so this always ends.
        """
        result = ReplayResult()
        for chunk in _slices(ids, batch_rows):
            moved = [r[0] for r in await self._fetch("dead_replay", chunk)]
            result.replayed += moved
            left = await self._fetch("dead_unreplayable", chunk, moved)
            result.left += [(r["id"], r["why"]) for r in left]
            if progress:
                progress(len(result.replayed) + len(result.left), len(ids))
        return result

    async def purge(self, keys: list[int], *, batch_rows: int = 10_000,
                    progress: Progress | None = None) -> int:
        """Delete these dead letters (a snapshot of their keys), one transaction per
        `batch_rows`."""
        total = 0
        for chunk in _slices(keys, batch_rows):
            total += await self._execute("dead_purge", chunk)
            if progress:
                progress(total, len(keys))
        return total

    async def prune_archive(self, *, older_than_s: float, batch_rows: int = 10_000,
                            ) -> ArchivePruned:
        """Archived rows published more than `older_than_s` ago, gone: a partitioned archive
        drops its partitions that hold only such rows (a partition only partly old waits for
        its turn) and deletes its DEFAULT partition's old rows in bounded batches; one that is
        not partitioned deletes its old rows in bounded batches."""
        partitioned = bool((await self._fetch("archive_is_partitioned"))[0][0])
        dropped = []
        if partitioned:
            dropped = await self._drop_partitions(older_than_s)
        name = "archive_prune_default" if partitioned else "archive_prune"
        deleted = 0
        while True:
            n = await self._execute(name, older_than_s, batch_rows)
            deleted += n
            if n < batch_rows:
                return ArchivePruned(dropped, deleted, partitioned)


    async def _drop_partitions(self, older_than_s: float) -> list[str]:
        """The old days' partitions dropped; each DROP waits at most 100 ms for its lock
        (sql/migrations/0026), so that archive INSERTs never queue behind it for long; tried
        again a few times while a reader holds the archive."""
        for pause_s in (*DROP_RETRY_PAUSES_S, None):
            try:
                return [r[0] for r in await self._conn.fetch(self.q["archive_drop_partitions"],
                                                             older_than_s)]
            except asyncpg.LockNotAvailableError:
                if pause_s is None:
                    break
                await asyncio.sleep(pause_s)
            except DB_ERRORS as exc:
                raise DatabaseError(f"dropping the archive's old partitions failed: "
                                    f"{exc or type(exc).__name__}") from exc
        raise DatabaseError(
            f"dropping the archive's old partitions: another session holds the archive (a "
            f"reader such as pg_dump or a report); its lock was not free within 100 ms, "
            f"{len(DROP_RETRY_PAUSES_S) + 1} times. Nothing was dropped; try again later")


# `relay prune`: pauses between tries to drop the old partitions while a reader holds the archive.
DROP_RETRY_PAUSES_S = (0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class ArchivePruned:
    """What `relay prune` did: partitions dropped whole, rows deleted one by one."""

    partitions: list[str]
    rows_deleted: int
    partitioned: bool


@contextlib.asynccontextmanager
async def open_dead_letters(db: DatabaseConfig) -> AsyncIterator[DeadLetters]:
    """The dead letters of the configured table over a session of their own (the dead-letter
    and retention commands)."""
    async with session(db, "cli") as conn:
        yield DeadLetters(conn, db.queries)


def _filter_of(args: dict[str, Any]) -> tuple[Filter, bool, bool]:
    """An admin call's filter (relay/ops/admin.py): the Filter, `all` and `dry_run`; a value
    of the wrong kind is a UsageError naming it."""
    ids, reason, older = args.get("ids"), args.get("reason"), args.get("older_than")
    limit, every, dry = args.get("limit"), args.get("all", False), args.get("dry_run", False)
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise UsageError("ids: a list of row ids")
    if reason is not None and not isinstance(reason, str):
        raise UsageError("reason: a text")
    if older is not None and not isinstance(older, str):
        raise UsageError("older_than: an age such as 7d or 12h")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise UsageError("limit: a whole number")
    if not isinstance(every, bool) or not isinstance(dry, bool):
        raise UsageError("all and dry_run: true or false")
    which = Filter(ids=ids or None, reason=reason,
                   older_than_s=None if older is None else parse_duration_s(older), limit=limit)
    return which, every, dry


# What one admin call may bring into the relay's memory: a listing of at most this many letters,
# a letter's content cut to this many characters (`relay dead show` prints it whole).
ADMIN_LIST_MAX = 1000
ADMIN_CONTENT_CHARS = 64 * 1024


async def admin_action(db: DatabaseConfig, action: str, args: dict[str, Any]) -> Any:
    """One call of the admin API: the dead-letter commands' logic with JSON in and out, over
    a session of its own. list (limit, reason), show (id), replay and purge (ids, reason,
    older_than, all, limit, dry_run; without a filter they need all)."""
    async with open_dead_letters(db) as dl:
        if action == "list":
            try:
                limit = int(args.get("limit") or 100)
            except ValueError:
                raise UsageError("limit: a whole number") from None
            if not 1 <= limit <= ADMIN_LIST_MAX:
                raise UsageError(f"limit: from 1 to {ADMIN_LIST_MAX}")
            return await dl.listing(limit=limit, reason=args.get("reason"))
        if action == "show":
            return await dl.show(str(args["id"]), content_chars=ADMIN_CONTENT_CHARS)
        which, every, dry = _filter_of(args)
        if not (which.narrows or every):
            raise UsageError(f"{action} what? give ids, reason, older_than or all: true")
        if action == "replay":
            ids = await dl.snapshot(which)
            if dry:
                return {"would": len(ids)}
            result = await dl.replay(ids)
            return {"replayed": result.replayed,
                    "left": [{"id": i, "why": why} for i, why in result.left]}
        keys = await dl.snapshot_keys(which)
        if dry:
            return {"would": len(keys)}
        return {"purged": await dl.purge(keys)}
