"""The database seam: every connection of the relay opens here, with its session settings, its
read-write check and its socket tuning, and every driver error is recognised here. asyncpg is
imported only inside relay/pg/ (tests/unit/test_layering.py); modules elsewhere see
DatabaseError and DatabaseUnavailable (relay/errors.py) and connections as opaque objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg

from relay import dsn
from relay.dsn import redact
from relay.errors import DatabaseError, DatabaseUnavailable
from relay.pg import compat as pg_compat
from relay.pg.config import DatabaseConfig
from relay.pg.queries import raw_queries
from relay.supervise import Backoff, Supervisor

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


def is_unavailable(exc: BaseException) -> bool:
    """No usable server now (UNAVAILABLE_ERRORS), or a session the server ended under a
    statement: asyncpg's bare InternalClientError "cannot switch to state ...; another
    operation is in progress" (a FATAL shutdown message read, the session not closed yet). It
    is one outage with the refusals that follow, not a second kind of error; its subclasses
    (a stale statement cache, a protocol error) stay errors."""
    state_error = type(exc) is asyncpg.exceptions.InternalClientError
    return state_error or isinstance(exc, UNAVAILABLE_ERRORS)

# The pool logs a traceback per failed reconnect of its idle floor; the worker logs each
# outage once itself (its Supervisor: connection_lost ... connection_restored).
logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)

# A pooled connection proxy or a plain connection: both run queries the same way.
Conn = Any


# The sessions that claim and settle rows (the outbox's worker pool, the stream slots'
# sessions) plan by the indexes, whatever the table's statistics say. Every statement they run
# on the claim and settle path reads a bounded part of the table through an index; a plan made
# while the statistics said "empty" (autovacuum after a quiet spell, a fresh database), and
# kept as the session's generic plan, scanned and sorted the whole bulk that came next on
# every claim until the next ANALYZE: one claim of 500 rows from 100,000 read 400,016 rows
# (0.48 s) instead of 651 (6 ms). Off means "at a huge cost" (15) or "last resort" (18): a
# statement with no index path still runs (the backlog's count reads the whole table and
# turns them on again for itself). A DSN's options that name one keep it.
# JIT off too: a plan that still holds a scan they price out costs over 10^10, far past
# jit_above_cost, and the server then compiled the claim on every run (0.64 s of CPU for a
# claim that takes 4 ms): these sessions' statements are short and never gain from it.
CLAIMING_ROLES = frozenset({"worker", "streams"})
PLANS_BY_INDEX = {"enable_seqscan": "off", "enable_bitmapscan": "off", "jit": "off"}


def connect_args(db: DatabaseConfig, role: str) -> dict[str, Any]:
    """asyncpg.connect() arguments: DSN, application_name, keepalives, transaction bounds."""
    # One libpq parser (relay/dsn.py) for both DSN forms; PG* variables fill what is absent.
    args: dict[str, Any] = dsn.parse(db.dsn).asyncpg_args() if db.dsn else {}
    from_dsn = args.pop("server_settings", {})
    app_name = f"outbox-relay {role} {socket.gethostname()} {os.getpid()}"[:63]
    # A relay cut off mid-batch must not hold its rows locked much longer than a batch may take;
    # a batch's publish always ends before this (relay/deadlines.py).
    deadlines = db.deadlines
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
        # A settle's commit need not wait for its WAL flush: one lost in a server crash
        # brings its rows back, and they are published again (a duplicate, never a loss).
        # The server applies startup settings after `options`, so a DSN that names the
        # setting in its options keeps its own.
        if "synchronous_commit" not in from_dsn.get("options", ""):
            args["server_settings"]["synchronous_commit"] = "off"
        # Claims and settles only: other sessions wait on locks (wake-up, leader) or migrate.
        args["server_settings"]["statement_timeout"] = str(deadlines.statement_timeout_ms)
        # The client gives up a little after the server would have cancelled the statement.
        args["command_timeout"] = deadlines.statement_timeout_s + 5
    else:
        args["command_timeout"] = db.lock_command_timeout_s
    if role in CLAIMING_ROLES:
        args["server_settings"].update(
            {k: v for k, v in PLANS_BY_INDEX.items() if k not in from_dsn.get("options", "")})
    return args


def session_args(db: DatabaseConfig, role: str) -> dict[str, Any]:
    """connect_args() for a session the relay keeps: every host of a multi-host DSN is tried,
    and unless the DSN says otherwise only a writable server (the primary) is accepted."""
    args = connect_args(db, role)
    for key, convert in (("host", str), ("port", int)):
        value = args.get(key)
        if isinstance(value, str) and "," in value:  # libpq keyword form: host=h1,h2
            args[key] = [convert(v) for v in value.split(",")]
    if ("target_session_attrs" not in args and "target_session_attrs" not in (db.dsn or "")
            and not os.environ.get("PGTARGETSESSIONATTRS")):
        args["target_session_attrs"] = "read-write"
    return args


def tune_socket(conn: Conn, user_timeout_ms: int) -> None:
    """Client-side TCP keepalives (10 s idle, then every 5 s) and TCP_USER_TIMEOUT on the
    session's socket (relay/pg/compat.py): a cut link is noticed by the kernel instead of a
    statement waiting out its timeout."""
    pg_compat.tune_socket(conn, idle_s=10, interval_s=5, user_timeout_ms=user_timeout_ms)


async def require_read_write(conn: Conn) -> None:
    """Refuse a session on a read-only server (a standby): it could neither claim nor lock."""
    try:
        read_only = await conn.fetchval(raw_queries()["session_read_only"])
    except DB_ERRORS as exc:
        raise DatabaseUnavailable(f"checking the server's role failed: {exc}") from exc
    if read_only:
        raise DatabaseUnavailable("the server is read-only (a standby?): trying again")


# The first server version with transaction_timeout.
TRANSACTION_TIMEOUT_SINCE = 17


async def bound_transactions(conn: Conn, transaction_ms: int) -> None:
    """On a server that has it, end any transaction of this session after `transaction_ms`
    (relay/deadlines.py): a backend that waits for the rest of a statement from a client cut
    off mid-send runs neither statement_timeout nor idle_in_transaction_session_timeout."""
    if conn.get_server_version().major < TRANSACTION_TIMEOUT_SINCE:
        return
    try:
        await conn.fetchval(raw_queries()["session_transaction_timeout"], str(transaction_ms))
    except DB_ERRORS as exc:
        raise DatabaseUnavailable(f"setting transaction_timeout failed: {exc}") from exc


def connect_failed(db: DatabaseConfig, exc: BaseException) -> DatabaseError:
    where = redact(db.dsn)
    kind = DatabaseUnavailable if is_unavailable(exc) else DatabaseError
    return kind(f"cannot connect to PostgreSQL at {where}: {exc}")


@contextlib.asynccontextmanager
async def session(db: DatabaseConfig, role: str, *,
                  wait: bool = False) -> AsyncIterator[asyncpg.Connection]:
    """A connection for one command (`relay status`, the dead-letter commands, migrate),
    closed at the end; `wait`: wait for a server that is not up yet (connect_when_up)."""
    conn = await (connect_when_up(db, role) if wait else connect(db, role))
    try:
        yield conn
    finally:
        await close_quietly(conn)


async def connect(db: DatabaseConfig, role: str) -> asyncpg.Connection:
    """One connection to a writable server, errors translated (DatabaseUnavailable: retry)."""
    try:
        conn: asyncpg.Connection = await asyncpg.connect(**session_args(db, role))
    except (*DB_ERRORS, *UNAVAILABLE_ERRORS) as exc:
        raise connect_failed(db, exc) from exc
    tune_socket(conn, db.deadlines.idle_in_transaction_ms)
    try:
        await require_read_write(conn)
    except DatabaseError:
        conn.terminate()
        raise
    return conn


def drop_if_stuck(conn: Conn, exc: BaseException) -> None:
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


@contextlib.contextmanager
def translated(doing: str, conn: Conn | None = None) -> Iterator[None]:
    """Driver errors inside the block become the relay's own (database_error: "<doing>
    failed: ..."). With `conn`, the statement ran on that connection: one that may be stuck
    is dropped first (drop_if_stuck)."""
    try:
        yield
    except DB_ERRORS as exc:
        if conn is not None:
            drop_if_stuck(conn, exc)
        raise database_error(exc, doing) from exc


def database_error(exc: BaseException, doing: str) -> DatabaseError:
    """A driver error as the relay's own: DatabaseUnavailable when no usable server answers
    (retried by the supervisors), DatabaseError otherwise."""
    kind = DatabaseUnavailable if is_unavailable(exc) else DatabaseError
    return kind(f"{doing} failed: {exc}")


async def connect_when_up(db: DatabaseConfig, role: str) -> asyncpg.Connection:
    """One session, waiting (bounded by RELAY_STARTUP_TIMEOUT_S) for a writable server.

    For one-shot commands such as `relay migrate`; raises `GaveUp` past the bound.
    """
    sup = Supervisor(role, backoff=Backoff(base_s=0.2, max_s=db.reconnect_max_s),
                     give_up_after_s=db.startup_timeout_s,
                     describe=redact(db.dsn))
    return await sup.establish(lambda: connect(db, role), retry_on=(DatabaseUnavailable,))


async def close_quietly(conn: Any, timeout_s: float = 5.0) -> None:
    """Close a session, bounded; a server that does not answer gets the socket closed."""
    if conn is None:
        return
    try:
        await asyncio.wait_for(conn.close(), timeout=timeout_s)
    except Exception:
        with contextlib.suppress(Exception):
            conn.terminate()


async def watch_session(conn: Any, ping_sql: str, *, interval_s: float,
                        timeout_s: float) -> str:
    """Wait until a kept session is gone; return why: closed (by the server, a failover, a
    cut noticed by the socket), or a ping every `interval_s` that failed or took longer than
    `timeout_s` (a server that went silent)."""
    lost = asyncio.Event()
    conn.add_termination_listener(lambda _c: lost.set())
    while not lost.is_set() and not conn.is_closed():
        try:
            async with asyncio.timeout(interval_s):
                await lost.wait()
        except TimeoutError:
            try:
                await conn.fetchval(ping_sql, timeout=timeout_s)
            except DB_ERRORS as exc:
                return f"ping failed: {type(exc).__name__}: {exc}"
    return "connection closed"
