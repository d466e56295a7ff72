"""The outbox store: claims, settles and reports through a small pool (connections open in
relay/pg/connection.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any

import asyncpg

from relay.errors import SchemaError
from relay.interfaces import ClaimOptions, Newest, OnSuccess, OutboxRow, Reason, Settlement
from relay.pg.archive import partitions_ahead
from relay.pg.config import DatabaseConfig
from relay.pg.connection import (
    DB_ERRORS,
    UNAVAILABLE_ERRORS,
    Conn,
    bound_transactions,
    connect_failed,
    database_error,
    require_read_write,
    session_args,
    translated,
    tune_socket,
)
from relay.pg.queries import Queries
from relay.pg.schema import require_current
from relay.pg.seqfloor import FROM_START, SeqFloor
from relay.pg.status import backlog_figures
from relay.pg.tablestats import TableStatistics
from relay.schedule import ScheduleError, is_interval, next_cron_time


async def _frontier_back_quietly(conn: Conn, q: Queries) -> None:
    """The table's shared fill frontier back to the floors, if the connection still works:
    otherwise the rows given back wait for the fair round or a rescan (relay/pg/seqfloor.py)."""
    # A connection the rollback terminated is already back in the pool: every call on it,
    # is_closed() too, raises InterfaceError (one of DB_ERRORS).
    with contextlib.suppress(*DB_ERRORS, TimeoutError):
        if not conn.is_closed():
            await asyncio.wait_for(conn.execute(q["fill_frontier_move"], FROM_START, False), 5)


async def _rollback_quietly(conn: Conn) -> None:
    """Roll back a claim; a connection the server or the pool already dropped is terminated."""
    try:
        if not conn.is_closed() and conn.is_in_transaction():
            await conn.execute("ROLLBACK")
    except DB_ERRORS:
        # The pool may already have reclaimed a connection the server dropped.
        with contextlib.suppress(asyncpg.InterfaceError):
            conn.terminate()


async def _keep_session(conn: Conn) -> None:
    """The pool's reset on release, a round trip on every batch by default (`SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`), is not needed: worker
    sessions change no session state (no LISTEN, no session-level lock, no SET but the
    transaction bound their init sets for the session's life, no cursor),
    and asyncpg still rolls back a transaction left open before calling this."""


class _Claim:
    """Rows locked by one open transaction; commit() ends it, else it rolls back.

    The transaction is begun and ended with plain statements (not the driver's transaction
    object), so that the usual end of a batch, the DELETE of its published rows, goes to the
    server with the COMMIT in one round trip."""

    def __init__(self, conn: Conn, queries: Queries, rows: list[OutboxRow],
                 on_success: OnSuccess) -> None:
        self._conn = conn
        self._q = queries
        self.rows: Sequence[OutboxRow] = rows
        self.more_due = False
        self._on_success = on_success
        self._delete_at_commit: list[str] = []
        self.committed = False
        # Rows this batch leaves in the table to be claimed again (retried, recurring).
        self.kept = False

    async def commit(self) -> None:
        """Commit the transaction: every settled fate becomes durable here."""
        with translated("commit", self._conn):
            if self._delete_at_commit:
                await self._conn.execute(self._q["delete_published_and_commit"].replace(
                    "{ids}", _uuid_array_literal(self._delete_at_commit)))
            else:
                await self._conn.execute("COMMIT")
        self.committed = True

    async def settle(self, settlement: Settlement) -> None:
        """Write every row's fate; the caller's transaction commits it. A batch whose rows
        were all published (and are deleted, not archived) is deleted by commit() itself.
        Published recurring rows stay, due again at their next time (docs/recurring.md); one
        whose schedule has no next time is parked."""
        schedules = {r.id: r.repeat for r in self.rows if r.repeat is not None}
        published = settlement.published
        repeating: list[tuple[str, datetime | None]] = []
        unschedulable: list[tuple[str, str, bool]] = []
        if schedules and any(rid in schedules for rid in settlement.published):
            # The database's clock, not this host's: a relay whose clock is behind would
            # schedule a frequent row in the database's past, due again at once.
            with translated("reading the database's clock", self._conn):
                now = await self._conn.fetchval(self._q["database_time"])
            published, repeating, unschedulable = split_recurring(settlement.published,
                                                                  schedules, now)
        dead = settlement.dead + unschedulable
        self.kept = bool(settlement.retry or repeating)
        if (self._on_success is OnSuccess.DELETE and not settlement.retry and not dead
                and not repeating):
            self._delete_at_commit = list(published)
            return
        archive = self._on_success is OnSuccess.ARCHIVE
        with translated("settling a batch", self._conn):
            if published:
                name = "archive_published" if archive else "delete_published"
                await self._conn.execute(self._q[name], published)
            if repeating:
                ids, times = zip(*repeating, strict=True)
                await self._conn.execute(self._q["reschedule_repeating"], ids, times, archive)
            if settlement.retry:
                ids, errors, delays, counted = zip(*settlement.retry, strict=True)
                await self._conn.execute(self._q["reschedule_failed"], ids, errors, delays,
                                         counted)
            if dead:
                ids, reasons, counted = zip(*dead, strict=True)
                await self._conn.execute(self._q["dead_letter"], ids, reasons, counted)


def split_recurring(published: list[str], schedules: Mapping[str, str], now: datetime,
                    ) -> tuple[list[str], list[tuple[str, datetime | None]],
                               list[tuple[str, str, bool]]]:
    """Published ids as: one-off rows; recurring rows with their next cron time after `now`
    (None for an interval, which the database counts from its own now); recurring rows to
    park, with the reason their schedule has no next time."""
    once: list[str] = []
    again: list[tuple[str, datetime | None]] = []
    park: list[tuple[str, str, bool]] = []
    for rid in published:
        repeat = schedules.get(rid)
        if repeat is None:
            once.append(rid)
        elif is_interval(repeat):
            again.append((rid, None))
        else:
            try:
                again.append((rid, next_cron_time(repeat, now)))
            except ScheduleError as exc:
                park.append((rid, f"{Reason.INVALID_REPEAT}: {exc}", False))
    return once, again, park


def _uuid_array_literal(ids: Sequence[str]) -> str:
    """`{id,...}` for a uuid[] literal in a script without parameters: every id is parsed as a
    uuid and written back in its canonical form, so nothing else can reach the SQL text."""
    return "{" + ",".join(str(uuid.UUID(i)) for i in ids) + "}"


async def claim_records(conn: Conn, q: Queries, opts: ClaimOptions, limit: int,
                        keyed_first: bool = True, *, floor: SeqFloor | None = None,
                        express: bool = False, after: int | None = None,
                        upto: int | None = None, keys: FairKeyCursor | None = None,
                        walker: SingleActiveWalk | None = None,
                        ) -> tuple[list[OutboxRow], bool]:
    """Lock up to `limit` rows and about `opts.max_bytes` of content, keyed head runs and
    unkeyed rows (those from `floor`'s start up, relay/pg/seqfloor.py), in one statement;
    return them in seq order, and whether the byte budget ended the claim.

    The first kind claimed may fill the batch and the other gets the rest; callers alternate
    `keyed_first`, so that a deep backlog of one kind cannot starve the other while a table
    holding one kind only still gets full batches.

    `express`: the fair round alone (the express lane, relay/loop/express.py), of the
    transactions newer than `after`; it reads the floor but never moves it, since its rows are
    the newest, not the lowest. `upto`: the fair round of any other claim takes transactions
    up to this one only (the newer ones are the express lane's while it runs). `keys`: where
    the fairness keys' round begins, moved on to the last key this claim served.
    """
    more = False
    if express:
        start = floor.start() if floor is not None else FROM_START
        records = list(await conn.fetch(q["claim_express"], limit, opts.max_bytes, start,
                                        None if after is None else str(after),
                                        opts.max_message_bytes))
    elif opts.fence:
        # single-active: one claimer at a time, so plain seq order keeps every key's order.
        await conn.execute(q["single_active_fence"])
        walk = walker if walker is not None else SingleActiveWalk()
        records = list(await conn.fetch(q["claim_single_active"], limit, opts.block_on_dead,
                                        opts.max_bytes, opts.max_message_bytes, walk.start(),
                                        walk.window(limit)))
        seen = records.pop()  # the walk's last row: what it saw (sql/queries.sql)
        walk.claimed(limit, [r["seq"] for r in records], _bytes(records) >= opts.max_bytes,
                     seen)
        more = walk.more
    else:
        start = floor.start() if floor is not None else FROM_START
        fill_from = floor.fill_start(start) if floor is not None else start
        shared = floor is not None and floor.shares()
        started = time.monotonic()
        key_from = keys.start if keys is not None else None
        records = list(await conn.fetch(q["claim"], limit, opts.keys_per_batch,
                                        opts.block_on_dead, opts.max_bytes, start, keyed_first,
                                        None if upto is None else str(upto),
                                        opts.max_message_bytes, key_from, fill_from, shared))
        if keys is not None:
            keys.served(key_from, [r["fair_key"] for r in records if r["fair_key"] is not None])
        if floor is not None:
            unkeyed = [r["seq"] for r in records if r["ordering_key"] is None]
            floor.claimed(start, min(unkeyed) if unkeyed else None, time.monotonic() - started)
    used = _bytes(records)
    if floor is not None and not express and not opts.fence:
        filled = [r["seq"] for r in records if r["fill"]]
        full = len(records) >= limit or used >= opts.max_bytes
        floor.filled(max(filled) if filled else None, full)
        # Every relay's fills: above what this one took while a backlog drains, at their
        # floors again once none is left above (relay/pg/seqfloor.py).
        await conn.execute(q["fill_frontier_move"], max(filled) if filled else FROM_START, full)
    records.sort(key=lambda r: r["seq"])
    rows = [
        # attempts is producer-writable: a negative count reads as none made yet.
        # A recurring row's age (the metrics') counts from the time its occurrence was due.
        OutboxRow(r["id"], r["exchange"], r["routing_key"], r["content"], r["options"],
                  max(r["attempts"], 0),
                  created_at_s=(r["created_at_s"] if r["occurrence_s"] is None
                                else r["occurrence_s"]),
                  ordering_key=r["ordering_key"], withheld=r["withheld"],
                  repeat=r["repeat"], occurrence_s=r["occurrence_s"])
        for r in records
    ]
    return rows, more or used >= opts.max_bytes


class SingleActiveWalk:
    """Where the single-active claim's second window begins (query claim_single_active).

    The claim looks at the table's first `window(limit)` rows and, when those give less than a
    batch, at as many after `after`: the cursor moves on over rows that cannot go (a key
    blocked by a retrying head or a dead letter, with any number of rows behind it) one window
    per claim, the claims following one another at once (`more`), and rests at the table's
    end, where new rows arrive. So a claim costs two windows whatever waits, and new rows
    behind a blocked stretch go at once. Rows the cursor passed over that can go later (a key
    whose blocking row, not at the table's head, came due; a row another session held) are
    found when it walks again from the start, every `rewalk_s` at most."""

    def __init__(self, rewalk_s: float = 30.0) -> None:
        self.after = 0
        self.more = False
        self.rewalk_s = rewalk_s
        self._walked_at = time.monotonic()

    @staticmethod
    def window(limit: int) -> int:
        """Rows one window looks at."""
        return 4 * max(limit, 0) + 64

    def start(self) -> int:
        """Where this claim's second window begins: at rest for `rewalk_s`, from the start."""
        now = time.monotonic()
        if self.after and not self.more and now - self._walked_at >= self.rewalk_s:
            self.after, self._walked_at = 0, now
        return self.after

    def claimed(self, limit: int, seqs: Sequence[int], by_bytes: bool,
                seen: Mapping[str, Any]) -> None:
        """A claim took rows `seqs` (`by_bytes`: the byte budget ended it); its walk `seen`:
        a_full (the first window was full), walked (the second was looked at), b_rows and
        b_end (its rows and its last seq)."""
        self.more = False
        b_rows, b_end = seen["b_rows"], seen["b_end"]
        if not seen["a_full"]:
            self.after = 0  # the whole table fits in the first window
        elif not seen["walked"]:
            pass  # the first window gave a batch
        elif len(seqs) >= limit or by_bytes:
            self.after = max([self.after, *seqs])  # a full batch: go on after its last row
        elif b_rows >= self.window(limit) and b_end is not None:
            self.after, self.more = b_end, True  # all of it passed over: the next window
        elif b_end is not None:
            self.after = b_end  # the walk reached the table's end: rest there


class FairKeyCursor:
    """Where the next claim's fairness keys' round begins (sql/migrations/0012): after the last
    key the previous claim served, in the order the round visits keys (text order from its
    start, then round to the beginning), so that with more keys than one claim visits, each
    key's turn comes. Shared by a relay's lanes: an approximate turn is enough."""

    def __init__(self) -> None:
        self.start: str | None = None

    def served(self, start: str | None, keys: Sequence[str]) -> None:
        """The claim that began at `start` served rows of `keys`."""
        if not keys:
            return
        if start is None:
            self.start = max(keys)
            return
        # Keys after `start` came first, then (round to the beginning) those up to it.
        after_wrap = [k for k in keys if k <= start]
        self.start = max(after_wrap) if after_wrap else max(keys)


def _bytes(records: Sequence[Any]) -> int:
    """Content and options bytes of claimed records (what the budget counts)."""
    # Options in characters, not re-encoded per row: the budget is "about", and options are
    # small beside content (the SQL side counts their octets).
    return sum(len(r["content"] or b"") + len(r["options"] or "") for r in records)


# Connections remembered as prepared before the set is cleared (a relay has a handful open).
PREPARED_KEPT = 1000


class Outbox:
    """Claims, settles and reports on the outbox table through a small connection pool."""

    def __init__(self, pool: asyncpg.Pool, queries: Queries, on_success: OnSuccess,
                 claim_options: ClaimOptions | None = None) -> None:
        self._pool = pool
        self.q = queries
        self._on_success = on_success
        self.claim_options = claim_options or ClaimOptions()
        self._claims = 0
        # Where unkeyed claims start: above what this process already moved (seqfloor.py).
        self.floor = SeqFloor()
        # While the express lane runs: the newest transaction of the drain's start; the fair
        # round of the drain's own claims stops there (ExpressOutbox.after).
        self.fair_upto: int | None = None
        # Where the next claim's fairness keys' round begins.
        self._fair_keys = FairKeyCursor()
        self._single_active = SingleActiveWalk()
        # The connections whose claim statements are prepared (_prepare): (server pid, id of
        # the connection's settings object, for the express lane's claim).
        self._prepared: set[tuple[int, int, bool]] = set()
        # The table analyzed when a backlog begins that its statistics do not count.
        self.statistics = TableStatistics()

    @classmethod
    async def open(cls, db: DatabaseConfig, *, size: int | None = None) -> Outbox:
        """Open the pool of `db.pool_size` connections, or `size` (fails fast with
        DatabaseError), and check the table is migrated."""
        n = size or db.pool_size
        try:
            # init: a pooled connection that lands on a standby is closed, never used to claim.
            deadlines = db.deadlines

            async def init(conn: Conn) -> None:
                tune_socket(conn, deadlines.idle_in_transaction_ms)
                await require_read_write(conn)
                await bound_transactions(conn, deadlines.transaction_ms)

            pool = await asyncpg.create_pool(
                min_size=1, max_size=n, init=init, reset=_keep_session,
                **session_args(db, "worker"),
            )
        except (*DB_ERRORS, *UNAVAILABLE_ERRORS) as exc:
            raise connect_failed(db, exc) from exc
        assert pool is not None
        outbox = cls(pool, db.queries, db.on_success, db.claim)
        try:
            exists = await pool.fetchval(outbox.q["table_exists"])
            if exists:
                async with pool.acquire() as conn:
                    await require_current(conn, outbox.q, db.table)
        except DB_ERRORS as exc:
            await pool.close()
            raise database_error(exc, "checking the outbox table") from exc
        except SchemaError:
            await pool.close()
            raise
        if not exists:
            await pool.close()
            raise SchemaError(f"table {db.table} does not exist: run `relay migrate` first")
        return outbox

    async def close(self) -> None:
        """Close the pool; connections in use are terminated after a short grace."""
        try:
            # pool.close() waits for every acquired connection; one stuck on a dead socket
            # must not hold a stopping relay past its shutdown bound.
            await asyncio.wait_for(self._pool.close(), timeout=5)
        except DB_ERRORS:
            self._pool.terminate()

    def terminate(self) -> None:
        """Close every connection at once (hard stop); open transactions roll back."""
        self._pool.terminate()

    def express(self) -> ExpressOutbox:
        """This outbox as the express lane claims it (relay/loop/express.py)."""
        return ExpressOutbox(self)

    async def newest_transaction(self, newer_than: int = 0) -> Newest:
        """The newest transaction newer than `newer_than` that has unkeyed rows in the outbox
        (None: none), and the oldest transaction still running."""
        async with self._taken() as conn:
            with translated("reading the newest transaction", conn):
                newest, running = await conn.fetchrow(self.q["newest_transaction"],
                                                      str(newer_than))
        return Newest(None if newest is None else int(newest), int(running))

    @asynccontextmanager
    async def _taken(self) -> AsyncIterator[Conn]:
        """A pooled connection, released bounded (_release). Statements on it run inside
        `translated(doing, conn)`, which drops a connection that timed out on the client (a
        silent server) at once: the pool's own release would reset the dead connection and wait
        another command timeout (a silent cut took twice the command timeout to notice while
        the express lane looked)."""
        with translated("taking a database connection"):
            conn = await self._pool.acquire()
        try:
            yield conn
        finally:
            # Also after a cancel in the middle of a statement (a lane still claiming when its
            # drain gave it up, a look given up): the release waits for the server to answer
            # the cancel, at most its bound (5 s) on a silent server. Terminating instead
            # would close a sound connection at every drain's end that cut a look short.
            await self._release(conn)

    async def _read_one(self, doing: str, query: str) -> Any:
        """One value a query reads on a pooled connection (_taken)."""
        async with self._taken() as conn:
            with translated(doing, conn):
                return await conn.fetchval(self.q[query])

    @asynccontextmanager
    async def claim(self, limit: int, *, express: bool = False, after: int | None = None,
                    max_bytes: int | None = None) -> AsyncIterator[_Claim]:
        """Lock up to `limit` due rows in a transaction; it rolls back unless committed.
        `express`: the fair round alone, of transactions newer than `after` (the express
        lane); `max_bytes`: a lane's smaller byte budget (relay/loop/budget.py)."""
        async with self._taken() as conn:
            with translated("claiming rows", conn):
                try:
                    await self._prepare(conn, express)
                    await conn.execute("BEGIN")
                    if not express:
                        self._claims += 1
                    opts = self.claim_options
                    if max_bytes is not None and max_bytes < opts.max_bytes:
                        opts = replace(opts, max_bytes=max_bytes)
                    records, more_due = await claim_records(
                        conn, self.q, opts, limit, self._claims % 2 == 0,
                        floor=self.floor, express=express, after=after, upto=self.fair_upto,
                        keys=self._fair_keys, walker=self._single_active)
                    if not express:
                        self.statistics.claimed(len(records),
                                                len(records) >= limit or bool(more_due))
                except asyncpg.UndefinedTableError as exc:
                    raise SchemaError() from exc
            batch = _Claim(conn, self.q, records, self._on_success)
            batch.more_due = more_due
            try:
                yield batch
            finally:
                if not batch.committed:
                    await _rollback_quietly(conn)
                if not express and (batch.kept or not batch.committed):
                    # Rows back in the table below the fill's frontier: the next fill
                    # starts at the floor again (relay/pg/seqfloor.py), every relay's too.
                    self.floor.released()
                    await _frontier_back_quietly(conn, self.q)
            if not express:
                # A backlog its statistics do not count: the table analyzed now, after this
                # batch, before the lanes' claims (relay/pg/tablestats.py).
                with translated("refreshing the table's statistics", conn):
                    await self.statistics.refresh_if_due(conn, self.q)

    async def _prepare(self, conn: Conn, express: bool) -> None:
        """Prepare, outside any transaction, every statement a claim's transaction runs, the
        first time this connection claims. asyncpg prepares a statement at its first use with
        Parse, Describe and Flush, and the server then waits for the rest without a timer
        running (`active`, ClientRead: not idle in transaction, no statement timing out): a
        link cut in that moment left the claim's rows locked for as long as the proxy that
        answers for the relay keeps the connection. Each statement runs once with nothing to
        do, which leaves it in the connection's statement cache."""
        key = (conn.get_server_pid(), id(conn.get_settings()), express)
        if key in self._prepared:
            return
        q, opts = self.q, self.claim_options
        if express:
            await conn.execute(q["claim_express"], 0, 0, FROM_START, None, opts.max_message_bytes)
        elif opts.fence:
            await conn.execute(q["claim_single_active"], 0, opts.block_on_dead, 0,
                               opts.max_message_bytes, 0, 0)
        else:
            await conn.execute(q["claim"], 0, opts.keys_per_batch, opts.block_on_dead, 0,
                               FROM_START, True, None, opts.max_message_bytes, None, FROM_START,
                               False)
            await conn.execute(q["fill_frontier_move"], FROM_START, True)  # moves nothing
        name = ("archive_published" if self._on_success is OnSuccess.ARCHIVE
                else "delete_published")
        await conn.execute(q[name], [])
        await conn.execute(q["reschedule_repeating"], [], [], False)
        await conn.execute(q["database_time"])
        await conn.execute(q["reschedule_failed"], [], [], [], [])
        await conn.execute(q["dead_letter"], [], [], [])
        if len(self._prepared) > PREPARED_KEPT:
            self._prepared.clear()  # connections come and go: forget the old ones now and then
        self._prepared.add(key)

    async def _release(self, conn: Conn) -> None:
        try:
            # Bounded: the reset of a connection whose server went silent must not wait.
            await self._pool.release(conn, timeout=5)
        except DB_ERRORS:
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.terminate()

    async def partitions_ahead(self) -> int:
        """A partitioned archive's missing partitions for the coming days, made now; how
        many (relay/pg/archive.py)."""
        return await partitions_ahead(self._pool, self.q)

    async def seconds_until_next_due(self) -> float | None:
        """Seconds until the earliest delayed row becomes due; None when no row waits."""
        value = await self._read_one("reading the next due time", "seconds_until_next_due")
        return None if value is None else max(float(value), 0.0)

    async def backlog(self) -> dict[str, Any]:
        """The backlog figures (relay/pg/status.py: backlog_figures) for the metrics and
        /readyz, and the sessions holding a relay role's lock that are not relays."""
        async with self._taken() as conn:
            try:
                # Dropped at once if it timed out (_taken), before the rollback below.
                with translated("reading the backlog", conn):
                    await conn.execute("BEGIN")
                    # Counts of the whole table: a scan is their plan (the pool's sessions
                    # plan by the indexes otherwise, relay/pg/connection.py PLANS_BY_INDEX).
                    await conn.execute(self.q["whole_table_plans"])
                    out = await backlog_figures(conn, self.q)
                    strangers = await conn.fetch(self.q["lock_strangers"])
            finally:
                await _rollback_quietly(conn)
        out["lock_strangers"] = [dict(r) for r in strangers]
        return out


class ExpressOutbox:
    """The outbox as the express lane sees it: claims of the fair round alone, of the
    transactions newer than `after`, on the same pool, and the look at the newest transaction
    between them."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._after: int | None = None
        # The lane's own claims start above this transaction (relay/loop/express.py).
        self.floor: int | None = None

    @property
    def after(self) -> int | None:
        """The lane claims transactions newer than this one (None: the lane is idle)."""
        return self._after

    @after.setter
    def after(self, value: int | None) -> None:
        # What the lane takes, the drain's own claims leave: a row committed meanwhile goes
        # with the lane's next small batch, not with a drain batch that happened to come
        # first. Set back to None, the drain's claims take every transaction again.
        self._after = value
        self._outbox.fair_upto = value
        self.floor = None

    def claim(self, limit: int, *, max_bytes: int | None = None
              ) -> AbstractAsyncContextManager[_Claim]:
        """The fair round's rows of the newest transactions, locked in a transaction."""
        after = self.after if self.floor is None or self.after is None \
            else max(self.after, self.floor)
        return self._outbox.claim(limit, express=True, after=after, max_bytes=max_bytes)

    async def seconds_until_next_due(self) -> float | None:
        """As the outbox's."""
        return await self._outbox.seconds_until_next_due()

    async def newest_transaction(self, newer_than: int = 0) -> Newest:
        """As the outbox's."""
        return await self._outbox.newest_transaction(newer_than)
