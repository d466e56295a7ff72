"""The inbox table: record a message in the handler's transaction, prune, count.

Needs asyncpg only. The statements are sql/inbox.sql's.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import asyncpg

from relay.pg.queries import parse, quote_ident, quote_literal, sql_dir

DEFAULT_TABLE = "relay_inbox"
OUTBOX_ID_HEADER = "x-outbox-id"
OCCURRENCE_HEADER = "x-outbox-occurrence"
# A key longer than this (bytes) is stored as its SHA-256: a btree entry has a size limit
# (about 2.7 kB), and no relay id comes near it (a uuid, with an occurrence ~70 bytes).
KEY_MAX_BYTES = 512
_IDENT = re.compile(r"[a-z_][a-z0-9_$]{0,62}")

# handler(message, conn): the delivered aio-pika message, and the connection (an asyncpg
# Connection, or a pool's proxy of one) whose transaction holds the inbox record.
Handler = Callable[[Any, Any], Awaitable[None]]


class InboxError(Exception):
    """A usage error of the inbox (a bad table name or setting, a missing table): its message
    says what to change."""


def table_name(text: str) -> tuple[str, ...]:
    """`relay_inbox` or `schema.relay_inbox`: lower-case unquoted identifiers only, each at most
    63 characters (PostgreSQL's limit), so the name a person types is the one in the catalog."""
    parts = tuple(text.split("."))
    if len(parts) > 2 or not all(_IDENT.fullmatch(p) for p in parts):
        raise InboxError(
            f"inbox table {text!r}: give a name or schema.name of lower-case letters, digits, "
            "_ and $ (not starting with a digit), each part at most 63 characters")
    return parts


@cache
def _raw() -> dict[str, str]:
    return parse((sql_dir() / "inbox.sql").read_text(encoding="utf-8"))


def queries(table: str = DEFAULT_TABLE) -> dict[str, str]:
    """sql/inbox.sql's statements for this table."""
    parts = table_name(table)
    def qualified(suffix: str = "") -> str:
        # a companion's name cut to stay within PostgreSQL's 63 bytes
        return ".".join(quote_ident(p) for p in (*parts[:-1], (parts[-1][:50] if suffix
                                                               else parts[-1]) + suffix))

    values = {"inbox": qualified(),
              # an index is made in its table's schema: its name is never qualified
              "inbox_index": quote_ident(f"{parts[-1][:50]}_received_idx"),
              "inbox_literal": quote_literal(qualified()),
              "inbox_attempts": qualified("_attempts"),
              "inbox_attempts_literal": quote_literal(qualified("_attempts")),
              "inbox_parked": qualified("_parked"),
              "inbox_parked_literal": quote_literal(qualified("_parked"))}
    return {name: re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), sql)
            for name, sql in _raw().items()}


_RESERVED = ("hex:", "sha256:")


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "hex:" + bytes(value).hex()
    text = str(value)
    # PostgreSQL's text cannot hold NUL; such an id is kept as the hex of its UTF-8 bytes, and
    # so is an id that could be read as one of these encodings, so that two ids never share a key.
    if "\x00" in text or text.startswith(_RESERVED):
        return "hex:" + text.encode().hex()
    return text


def _id_text(value: Any) -> str:
    text = _text(value)
    # An id holding `@` could be read as another id and an occurrence: kept as its bytes too.
    return "hex:" + text.encode().hex() if "@" in text else text


def message_key(headers: Mapping[str, Any] | None, message_id: Any) -> str | None:
    """What the inbox records for a message: the relay's row id (its `x-outbox-id` header, else
    the message_id), with the occurrence for a recurring row (each occurrence carries the row's
    id). None when the message carries neither. Two different ids never give one key: an id with
    NUL, not UTF-8, starting `hex:` or `sha256:`, or holding `@` (the occurrence's separator) is
    recorded as `hex:` and its bytes; a key over KEY_MAX_BYTES as `sha256:` and its digest."""
    headers = headers or {}
    raw = headers.get(OUTBOX_ID_HEADER)
    if raw is None or raw in ("", b""):
        raw = message_id
    if raw is None or raw in ("", b""):
        return None
    key = _id_text(raw)
    occurrence = headers.get(OCCURRENCE_HEADER)
    if occurrence is not None:
        key = f"{key}@{_text(occurrence)}"
    if len(key.encode()) > KEY_MAX_BYTES:
        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


@dataclass(frozen=True)
class ParkedMessage:
    """What the inbox keeps of a message it gives up: where it came from, its headers (as
    JSON; values JSON cannot hold as text) and its body."""

    exchange: str | None
    routing_key: str | None
    headers: Mapping[str, Any]
    body: bytes


@dataclass(frozen=True)
class ConsumerCount:
    """One consumer's rows in the inbox."""

    consumer: str
    messages: int
    oldest: datetime
    newest: datetime


@dataclass(frozen=True)
class InboxStats:
    """What the inbox holds: per consumer, and the table's size on disk."""

    consumers: tuple[ConsumerCount, ...]
    table_bytes: int

    @property
    def messages(self) -> int:
        """Rows of every consumer."""
        return sum(c.messages for c in self.consumers)


async def migrate(conn: asyncpg.Connection, table: str = DEFAULT_TABLE) -> None:
    """Create the inbox table and its index (idempotent)."""
    await conn.execute(queries(table)["inbox_create"])


class Inbox:
    """One consumer's view of the inbox table, on the consumer's own connection pool."""

    def __init__(self, pool: asyncpg.Pool, consumer: str, table: str = DEFAULT_TABLE) -> None:
        if not consumer:
            raise InboxError("inbox consumer name: give a non-empty name (the queue's, say)")
        self.pool = pool
        self.consumer = consumer
        self.table = table
        self.sql = queries(table)

    async def check(self) -> None:
        """Raise InboxError when the table is missing (with the command that makes it)."""
        await require_table(self.pool, self.table)

    async def handle(self, key: str, message: Any, handler: Handler, *,
                     counted: bool = False) -> bool:
        """In one transaction: record `key`; if it is new, run `handler(message, conn)` on that
        transaction's connection; commit. True when the handler ran and committed, False for a
        message recorded before (nothing ran). A handler's exception rolls the record back and
        propagates. `counted`: this message's deliveries are counted (count_attempt), and the
        count goes with the commit."""
        async with self.pool.acquire() as conn, conn.transaction():
            if counted:
                await conn.execute(self.sql["inbox_attempts_done"], self.consumer, key)
            if not await conn.fetchval(self.sql["inbox_record"], self.consumer, key):
                return False
            await handler(message, conn)
        return True

    async def count_attempt(self, key: str) -> int:
        """Count a delivery of a message the broker delivered again, committed before the
        handler runs; this delivery's number (2 for the first one counted)."""
        return int(await self.pool.fetchval(self.sql["inbox_attempt"], self.consumer, key))

    async def outcome_known(self, key: str) -> str | None:
        """'handled' when the message's handler committed before, 'parked' when it was given
        up before, else None."""
        if await self.pool.fetchval(self.sql["inbox_handled"], self.consumer, key):
            return "handled"
        if await self.pool.fetchval(self.sql["inbox_is_parked"], self.consumer, key):
            return "parked"
        return None

    async def park(self, key: str, message: ParkedMessage, reason: str, attempts: int) -> None:
        """Keep a message given up, whole, with `reason`; its count of deliveries goes."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(self.sql["inbox_park"], self.consumer, key, reason, attempts,
                               message.exchange, message.routing_key,
                               json.dumps(message.headers, default=str), message.body)
            await conn.execute(self.sql["inbox_attempts_done"], self.consumer, key)

    async def prune(self, older_than_s: float, batch: int = 10_000) -> int:
        """Delete rows recorded more than `older_than_s` ago (every consumer's), in batches;
        the rows deleted."""
        return await prune(self.pool, older_than_s, self.table, batch)

    async def stats(self) -> InboxStats:
        """Rows per consumer and the table's size."""
        return await stats(self.pool, self.table)


async def require_table(conn: asyncpg.Pool | asyncpg.Connection,
                        table: str = DEFAULT_TABLE) -> None:
    """Raise InboxError when the table is missing (with the command that makes it)."""
    if not await conn.fetchval(queries(table)["inbox_exists"]):
        raise InboxError(f"inbox table {table!r} (with its _attempts and _parked tables) does "
                         "not exist in this database: run `relay inbox migrate --dsn <the "
                         f"consumer's database> --table {table}`")


async def prune(conn: asyncpg.Pool | asyncpg.Connection, older_than_s: float,
                table: str = DEFAULT_TABLE, batch: int = 10_000) -> int:
    """Delete rows recorded more than `older_than_s` ago, `batch` per statement (each its own
    transaction, so producers' inserts never wait long); the rows deleted."""
    await require_table(conn, table)
    sql = queries(table)
    deleted = 0
    while True:
        n = int((await conn.execute(sql["inbox_prune"], float(older_than_s), batch)).split()[-1])
        deleted += n
        if n < batch:
            break
    await conn.execute(sql["inbox_prune_attempts"], float(older_than_s))
    return deleted


async def stats(conn: asyncpg.Pool | asyncpg.Connection, table: str = DEFAULT_TABLE,
                ) -> InboxStats:
    """What the inbox table holds (every consumer)."""
    await require_table(conn, table)
    sql = queries(table)
    rows = await conn.fetch(sql["inbox_stats"])
    size = await conn.fetchval(sql["inbox_size"])
    return InboxStats(tuple(ConsumerCount(r["consumer"], r["messages"], r["oldest"],
                                          r["newest"]) for r in rows), int(size))


@asynccontextmanager
async def session(dsn: str | None) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the consumer's database (None: libpq's PG* variables); a server that
    does not answer or refuses is an InboxError saying so (the DSN's password left out)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        where = "the PG* variables' server" if not dsn else _without_password(dsn)
        raise InboxError(f"cannot connect to {where}: {exc}") from None
    try:
        yield conn
    finally:
        await conn.close()


def _without_password(dsn: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", dsn)
