"""The store: every database call of the relay loop (asyncpg lives here and in listener.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from relay import dsn
from relay.deadlines import Deadlines
from relay.errors import DatabaseError, DatabaseUnavailable, SchemaError
from relay.interfaces import ClaimOptions, OutboxRow, Settlement
from relay.pg import compat as pg_compat
from relay.pg.queries import Queries, TableNames, raw_queries
from relay.pg.schema import require_current
from relay.pg.seqfloor import SWEEP, SeqFloor
from relay.settings import OnSuccess, Settings, redact_url

DB_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # A connection whose server vanished mid-statement (kill -9, failover) can surface as
    # "cannot switch to state ...; another operation is in progress".
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)

# "No usable server now" (down, starting or shutting down, out of connection slots, or no host of
# a multi-host DSN is writable): retried by the supervisors, never a configuration error.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.TargetServerAttributeNotMatched,
)

# The pool logs a traceback per failed reconnect of its idle floor; the worker logs each
# outage once itself (its Supervisor: connection_lost ... connection_restored).
logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)

# A pooled connection proxy or a plain connection: both run queries the same way.
Conn = Any



def table_names(settings: Settings) -> TableNames:
    """The quoted names of the configured outbox table and its companions."""
    return TableNames(settings.table_schema, settings.table_name, settings.notify_channel)


def connect_args(settings: Settings, role: str) -> dict[str, Any]:
    """asyncpg.connect() arguments: DSN, application_name, keepalives, transaction bounds."""
    # One libpq parser (relay/dsn.py) for both DSN forms; PG* variables fill what is absent.
    args: dict[str, Any] = dsn.parse(settings.pg_dsn).asyncpg_args() if settings.pg_dsn else {}
    from_dsn = args.pop("server_settings", {})
    app_name = f"outbox-relay {role} {socket.gethostname()} {os.getpid()}"[:63]
    # A relay cut off mid-batch must not hold its rows locked much longer than a batch may take;
    # a batch's publish always ends before this (relay/deadlines.py).
    deadlines = Deadlines.from_settings(settings)
    args["server_settings"] = {
        **from_dsn,  # options=-c ... from the DSN; the relay names its sessions itself
        "application_name": app_name,
        "idle_in_transaction_session_timeout": str(deadlines.idle_in_transaction_ms),
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "5",
        "tcp_keepalives_count": "3",
        # Data the server sent that the relay's host never acknowledges (a cut link) ends
        # the session after this, so a backend blocked in send cannot hold rows locked
        # past the idle-in-transaction bound.
        "tcp_user_timeout": str(deadlines.idle_in_transaction_ms),
    }
    args.setdefault("timeout", 10)
    if role == "worker":
        # Claims and settles only: other sessions wait on locks (wake-up, leader) or migrate.
        args["server_settings"]["statement_timeout"] = str(deadlines.statement_timeout_ms)
        # The client gives up a little after the server would have cancelled the statement.
        args["command_timeout"] = deadlines.statement_timeout_s + 5
    else:
        args["command_timeout"] = max(30.0, settings.publish_timeout_s * 2)
    return args


def session_args(settings: Settings, role: str) -> dict[str, Any]:
    """connect_args() for a session the relay keeps: every host of a multi-host DSN is tried,
    and unless the DSN says otherwise only a writable server (the primary) is accepted."""
    args = connect_args(settings, role)
    for key, convert in (("host", str), ("port", int)):
        value = args.get(key)
        if isinstance(value, str) and "," in value:  # libpq keyword form: host=h1,h2
            args[key] = [convert(v) for v in value.split(",")]
    if ("target_session_attrs" not in args and "target_session_attrs" not in (settings.pg_dsn or "")
            and not os.environ.get("PGTARGETSESSIONATTRS")):
        args["target_session_attrs"] = "read-write"
    return args


def tune_socket(conn: Conn, user_timeout_ms: int) -> None:
    """Client-side TCP keepalives and TCP_USER_TIMEOUT on the session's socket: a cut link is
    noticed by the kernel (unanswered keepalives on an idle session, unacknowledged data on a
    busy one) instead of a statement waiting out its timeout. The tcp_keepalives_* server
    settings only cover the server's side. asyncpg has no option for this: its transport's
    socket is reached through relay/pg/compat.py (tests/integration/test_compat.py)."""
    sock = pg_compat.socket_of(conn)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a unix socket has no network to lose
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3),
                            ("TCP_USER_TIMEOUT", user_timeout_ms)):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


async def require_read_write(conn: Conn) -> None:
    """Refuse a session on a read-only server (a standby): it could neither claim nor lock."""
    try:
        read_only = await conn.fetchval(raw_queries()["session_read_only"])
    except DB_ERRORS as exc:
        raise DatabaseUnavailable(f"checking the server's role failed: {exc}") from exc
    if read_only:
        raise DatabaseUnavailable("the server is read-only (a standby?): trying again")


def _connect_failed(settings: Settings, exc: BaseException) -> DatabaseError:
    where = redact_url(settings.pg_dsn)
    kind = DatabaseUnavailable if isinstance(exc, UNAVAILABLE_ERRORS) else DatabaseError
    return kind(f"cannot connect to PostgreSQL at {where}: {exc}")


async def connect(settings: Settings, role: str) -> asyncpg.Connection:
    """One connection to a writable server, errors translated (DatabaseUnavailable: retry)."""
    try:
        conn: asyncpg.Connection = await asyncpg.connect(**session_args(settings, role))
    except (*DB_ERRORS, *UNAVAILABLE_ERRORS) as exc:
        raise _connect_failed(settings, exc) from exc
    tune_socket(conn, Deadlines.from_settings(settings).idle_in_transaction_ms)
    try:
        await require_read_write(conn)
    except DatabaseError:
        conn.terminate()
        raise
    return conn


def _drop_if_stuck(conn: Conn, exc: BaseException) -> None:
    """Terminate the connection at once unless the server itself reported the error (then the
    session is sound and a rollback works). A statement that timed out on the client means a
    server that does not answer, usually a silent network cut: a rollback, a commit or the
    pool's reset on it would each wait another command timeout. A client-side state error
    (asyncpg's "cannot switch to state ...; another operation is in progress", after its
    server session was ended under a statement) leaves a connection whose next statement can
    hang: back in the pool, it stalled a batch's settle and the relay's stop."""
    if not isinstance(exc, asyncpg.PostgresError) or isinstance(
            exc, asyncpg.PostgresConnectionError | asyncpg.exceptions.OperatorInterventionError):
        with contextlib.suppress(Exception):
            conn.terminate()


async def _rollback_quietly(conn: Conn, tx: Any) -> None:
    """Roll back a claim; a connection the server or the pool already dropped is terminated."""
    try:
        if not conn.is_closed():
            await tx.rollback()
    except DB_ERRORS:
        # The pool may already have reclaimed a connection the server dropped.
        with contextlib.suppress(asyncpg.InterfaceError):
            conn.terminate()


async def _keep_session(conn: Conn) -> None:
    """The pool's reset on release, a round trip on every batch by default (`SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`), is not needed: worker
    sessions change no session state (no LISTEN, no session-level lock, no SET, no cursor),
    and asyncpg still rolls back a transaction left open before calling this."""


class _Claim:
    """Rows locked by one open transaction; commit() ends it, else it rolls back."""

    def __init__(self, conn: Conn, tx: Any, queries: Queries, rows: list[OutboxRow],
                 on_success: OnSuccess) -> None:
        self._conn = conn
        self._tx = tx
        self._q = queries
        self.rows: Sequence[OutboxRow] = rows
        self.full_by_bytes = False
        self._on_success = on_success
        self.committed = False

    async def commit(self) -> None:
        """Commit the transaction: every settled fate becomes durable here."""
        try:
            await self._tx.commit()
        except DB_ERRORS as exc:
            _drop_if_stuck(self._conn, exc)
            raise DatabaseError(f"commit failed: {exc}") from exc
        self.committed = True

    async def settle(self, settlement: Settlement) -> None:
        """Write every row's fate; the caller's transaction commits it."""
        try:
            if settlement.published:
                archive = self._on_success is OnSuccess.ARCHIVE
                name = "archive_published" if archive else "delete_published"
                await self._conn.execute(self._q[name], settlement.published)
            if settlement.retry:
                ids, errors, delays = zip(*settlement.retry, strict=True)
                await self._conn.execute(self._q["reschedule_failed"], ids, errors, delays)
            if settlement.dead:
                ids, reasons, counted = zip(*settlement.dead, strict=True)
                await self._conn.execute(self._q["dead_letter"], ids, reasons, counted)
                await self._conn.execute(self._q["notify_dead"], str(len(ids)))
        except DB_ERRORS as exc:
            _drop_if_stuck(self._conn, exc)
            raise DatabaseError(f"settling a batch failed: {exc}") from exc


async def claim_records(conn: Conn, q: Queries, opts: ClaimOptions, limit: int,
                        keyed_first: bool = True, *, floor: SeqFloor | None = None,
                        ) -> tuple[list[OutboxRow], bool]:
    """Lock up to `limit` rows and about `opts.max_bytes` of content, keyed head runs and
    unkeyed rows (those from `floor`'s start up, relay/pg/seqfloor.py); return them in seq
    order, and whether the byte budget ended the claim.

    The first kind claimed may fill the batch and the other gets the rest; callers alternate
    `keyed_first`, so that a deep backlog of one kind cannot starve the other while a table
    holding one kind only still gets full batches.
    """
    records: list[Any] = []
    used = 0
    if opts.fence:
        # single-active: one claimer at a time, so plain seq order keeps every key's order.
        await conn.execute(q["single_active_fence"])
        records = await conn.fetch(q["claim_single_active"], limit, opts.block_on_dead,
                                   opts.max_bytes)
        used = _bytes(records)
    for keyed in (keyed_first, not keyed_first) if not opts.fence else ():
        room = limit - len(records)
        if room <= 0 or used >= opts.max_bytes:
            break
        if keyed:
            got = await conn.fetch(q["claim_keyed"], room, opts.keys_per_batch,
                                   opts.block_on_dead, opts.max_bytes - used)
        else:
            start = floor.start() if floor is not None else SWEEP
            started = time.monotonic()
            got = await conn.fetch(q["claim_batch"], room, opts.max_bytes - used, start)
            if floor is not None:
                floor.claimed(start, got[0]["seq"] if got else None, time.monotonic() - started)
        records += got
        used += _bytes(got)
    records.sort(key=lambda r: r["seq"])
    rows = [
        # attempts is producer-writable: a negative count reads as none made yet.
        OutboxRow(r["id"], r["exchange"], r["routing_key"], r["content"], r["options"],
                  max(r["attempts"], 0), created_at_s=r["created_at_s"],
                  ordering_key=r["ordering_key"])
        for r in records
    ]
    return rows, used >= opts.max_bytes


def _bytes(records: Sequence[Any]) -> int:
    """Content and options bytes of claimed records (what the budget counts)."""
    # Options in characters, not re-encoded per row: the budget is "about", and options are
    # small beside content (the SQL side counts their octets).
    return sum(len(r["content"] or b"") + len(r["options"] or "") for r in records)


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

    @classmethod
    async def open(cls, settings: Settings, *, size: int | None = None) -> Outbox:
        """Open the pool (fails fast with DatabaseError) and check the table is migrated."""
        n = size or settings.concurrency + 1
        try:
            # init: a pooled connection that lands on a standby is closed, never used to claim.
            user_timeout_ms = Deadlines.from_settings(settings).idle_in_transaction_ms

            async def init(conn: Conn) -> None:
                tune_socket(conn, user_timeout_ms)
                await require_read_write(conn)

            pool = await asyncpg.create_pool(
                min_size=1, max_size=n, init=init, reset=_keep_session,
                **session_args(settings, "worker"),
            )
        except (*DB_ERRORS, *UNAVAILABLE_ERRORS) as exc:
            raise _connect_failed(settings, exc) from exc
        assert pool is not None
        outbox = cls(pool, Queries(table_names(settings)), settings.on_success,
                     ClaimOptions.from_settings(settings))
        try:
            exists = await pool.fetchval(outbox.q["table_exists"])
            if exists:
                async with pool.acquire() as conn:
                    await require_current(conn, outbox.q, settings.table)
        except DB_ERRORS as exc:
            await pool.close()
            kind = DatabaseUnavailable if isinstance(exc, UNAVAILABLE_ERRORS) else DatabaseError
            raise kind(f"checking the outbox table failed: {exc}") from exc
        except SchemaError:
            await pool.close()
            raise
        if not exists:
            await pool.close()
            raise SchemaError(f"table {settings.table} does not exist: run `relay migrate` first")
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

    @asynccontextmanager
    async def claim(self, limit: int) -> AsyncIterator[_Claim]:
        """Lock up to `limit` due rows in a transaction; it rolls back unless committed."""
        try:
            conn = await self._pool.acquire()
        except DB_ERRORS as exc:
            raise DatabaseError(f"no database connection: {exc}") from exc
        try:
            tx = conn.transaction()
            try:
                await tx.start()
                self._claims += 1
                records, full_by_bytes = await claim_records(
                    conn, self.q, self.claim_options, limit, self._claims % 2 == 0,
                    floor=self.floor)
            except asyncpg.UndefinedTableError as exc:
                raise SchemaError() from exc
            except DB_ERRORS as exc:
                _drop_if_stuck(conn, exc)
                raise DatabaseError(f"claiming rows failed: {exc}") from exc
            batch = _Claim(conn, tx, self.q, records, self._on_success)
            batch.full_by_bytes = full_by_bytes
            try:
                yield batch
            finally:
                if not batch.committed:
                    await _rollback_quietly(conn, tx)
        finally:
            await self._release(conn)

    async def _release(self, conn: Conn) -> None:
        try:
            # Bounded: the reset of a connection whose server went silent must not wait.
            await self._pool.release(conn, timeout=5)
        except DB_ERRORS:
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.terminate()

    async def seconds_until_next_due(self) -> float | None:
        """Seconds until the earliest delayed row becomes due; None when no row waits."""
        try:
            value = await self._pool.fetchval(self.q["seconds_until_next_due"])
        except DB_ERRORS as exc:
            raise DatabaseError(f"reading the next due time failed: {exc}") from exc
        return None if value is None else max(float(value), 0.0)

    async def backlog(self) -> dict[str, Any]:
        """Counts and ages for `relay status` and metrics."""
        try:
            row = await self._pool.fetchrow(self.q["backlog"])
            dead = await self._pool.fetchval(self.q["dead_count"])
            health = await self._pool.fetchrow(self.q["table_health"])
        except DB_ERRORS as exc:
            raise DatabaseError(f"reading the backlog failed: {exc}") from exc
        assert row is not None
        out = dict(row)
        out["dead"] = dead
        out["dead_tuples"] = health["n_dead_tup"] if health else None
        out["last_vacuum_age_s"] = health["vacuum_age_s"] if health else None
        return out

    async def relay_sessions(self) -> int:
        """How many relay processes hold a LISTEN session on this database right now."""
        try:
            return int(await self._pool.fetchval(self.q["relay_sessions"]))
        except DB_ERRORS as exc:
            raise DatabaseError(f"reading relay sessions failed: {exc}") from exc
