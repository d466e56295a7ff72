"""The stream rows' table (sql/migrations/0017_streams.sql, docs/streams.md): slots and their
leases, publishing ids given in committed transactions, settles. One connection of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from relay.pg.config import DatabaseConfig
from relay.pg.connection import connect, translated
from relay.pg.queries import Queries


@dataclass(frozen=True)
class StreamRow:
    """One row to send: its id, stream, JSON body and publishing id."""

    id: str
    stream: str
    body: bytes
    publishing_id: int


class SleepTry(enum.Enum):
    """What a try for the stream table's wake-up lock found (StreamStore.try_sleep)."""

    ASLEEP = "asleep"
    ROWS_WAITING = "rows waiting"
    WRITING = "producers writing"
    PEER_ASLEEP = "another relay asleep"


class StreamStore:
    """What the stream worker asks of the database, as relay `owner`."""

    def __init__(self, conn: asyncpg.Connection, queries: Queries, owner: str) -> None:
        self._conn = conn
        self.q = queries
        self.owner = owner

    @classmethod
    async def open(cls, db: DatabaseConfig, owner: str) -> StreamStore:
        """A connection of its own (role `streams`)."""
        return cls(await connect(db, "streams"), db.queries, owner)

    async def close(self) -> None:
        """Close the connection (a transaction left open rolls back)."""
        await self._conn.close()

    def terminate(self) -> None:
        """Drop the connection at once."""
        self._conn.terminate()

    async def ensure_slots(self, slots: int) -> None:
        """Slots 0..slots-1 exist."""
        with translated("creating stream slots"):
            await self._conn.execute(self.q["stream_slots_ensure"], slots)

    async def heartbeat(self, seen_s: float) -> int:
        """Note this relay alive; how many stream relays are (this one included)."""
        with translated("noting the stream relay alive"):
            return int(await self._conn.fetchval(self.q["stream_heartbeat"], self.owner,
                                                 float(seen_s)))

    async def take_slot(self, lease_s: float, slots: int) -> int | None:
        """A free slot below `slots`, leased for `lease_s`; None when none is free."""
        with translated("taking a stream slot"):
            value = await self._conn.fetchval(self.q["stream_slot_take"], self.owner,
                                              float(lease_s), slots)
        return None if value is None else int(value)

    async def renew(self, slot: int, lease_s: float) -> bool:
        """Keep the slot's lease; False when it was lost."""
        with translated("renewing a stream slot's lease"):
            return await self._conn.fetchval(self.q["stream_slot_renew"], self.owner, slot,
                                             float(lease_s)) is not None

    async def release(self, slot: int) -> None:
        """Give the slot up (another relay may take it at once)."""
        with translated("releasing a stream slot"):
            await self._conn.execute(self.q["stream_slot_release"], self.owner, slot)

    async def identity(self) -> str:
        """What tells this outbox from any other for producer names: the cluster's system
        identifier, the database's oid and the stream table's, as one text."""
        with translated("reading the outbox's identity"):
            return str(await self._conn.fetchval(self.q["stream_identity"]))

    async def last_given(self, slot: int, stream: str) -> int:
        """The last publishing id given in `slot` for `stream` (0: none)."""
        with translated("reading the last publishing id given"):
            return int(await self._conn.fetchval(self.q["stream_last_given"], slot, stream))

    async def legacy_of(self, slot: int, stream: str) -> int | None:
        """The last publishing id given in `slot` for `stream` under the slot's old producer
        name (sql/migrations/0022); None when there is none to settle."""
        with translated("reading the old producer name's ids"):
            value = await self._conn.fetchval(self.q["stream_legacy_of"], slot, stream)
        return None if value is None else int(value)

    async def legacy_done(self, slot: int, stream: str) -> None:
        """The old producer name's rows of (slot, stream) are settled or sent again."""
        with translated("forgetting the old producer name's ids"):
            await self._conn.execute(self.q["stream_legacy_done"], slot, stream)

    async def settle_stored(self, slot: int, stream: str, last_stored: int) -> int:
        """Delete the slot's rows the broker already stored (ids at or below `last_stored`),
        and give no id at or below it again; how many."""
        with translated("settling rows the broker stored"):
            return int(await self._conn.fetchval(self.q["stream_settle_stored"], slot, stream,
                                                 last_stored))

    async def send_again(self, slot: int, stream: str, mark: int, up_to: int) -> int:
        """The slot's rows in `stream` with ids at or below `up_to` lose their ids (sent again
        with new ones), and no id at or below `mark` is given again; how many rows."""
        with translated("giving rows new publishing ids"):
            return int(await self._conn.fetchval(self.q["stream_send_again"], slot, stream,
                                                 mark, up_to))

    async def unsynced(self, known: list[str], limit: int) -> list[str]:
        """Streams of the next `limit` rows without a slot, other than `known`."""
        with translated("reading the streams of rows to assign"):
            return [r["stream"] for r in await self._conn.fetch(self.q["stream_unsynced"],
                                                                 limit, known)]

    async def assign(self, slot: int, lease_s: float, limit: int,
                     streams: list[str]) -> int | None:
        """Give up to `limit` unassigned rows of `streams` to the slot, in a transaction that
        first renews its lease; how many (None: the lease was lost, nothing assigned)."""
        with translated("assigning publishing ids"):
            async with self._conn.transaction():
                if await self._conn.fetchval(self.q["stream_slot_renew"], self.owner, slot,
                                             float(lease_s)) is None:
                    return None
                if not streams:
                    return 0
                return len(await self._conn.fetch(self.q["stream_assign"], slot, limit,
                                                  streams))

    async def assigned(self, slot: int, limit: int) -> list[StreamRow]:
        """The slot's rows to send, in publishing id order per stream, `limit` of each."""
        with translated("reading assigned stream rows"):
            rows = await self._conn.fetch(self.q["stream_assigned"], slot, limit)
        return [StreamRow(r["id"], r["stream"], r["body"].encode(), int(r["publishing_id"]))
                for r in rows]

    async def settle(self, ids: list[str]) -> None:
        """Delete rows the broker confirmed."""
        if ids:
            with translated("deleting confirmed stream rows"):
                await self._conn.execute(self.q["stream_settle"], ids)

    async def reassign(self, ids: list[str]) -> None:
        """Rows the broker refused get new publishing ids at the next assignment."""
        if ids:
            with translated("reassigning refused stream rows"):
                await self._conn.execute(self.q["stream_reassign"], ids)

    async def park(self, ids: list[str], reason: str) -> int:
        """Move rows that can never be sent to the stream dead letters with `reason`; how
        many."""
        if not ids:
            return 0
        with translated("parking stream rows"):
            return int(await self._conn.fetchval(self.q["stream_park"], ids, reason))

    async def listen(self, on_notify: Callable[[], None]) -> None:
        """LISTEN on the stream table's channel (sql/migrations/0019); `on_notify()` at each
        NOTIFY. The connection then serves only the wake-up lock."""
        with translated("listening for stream rows"):
            await self._conn.add_listener(self.q.names.stream_channel,
                                          lambda *_: on_notify())

    async def try_sleep(self) -> tuple[SleepTry, bool]:
        """Take the stream table's wake-up lock for a sleep, and say whether producers NOTIFY
        (`RELAY_NOTIFY=off`: they do not). ASLEEP: the lock is held. Otherwise not held:
        ROWS_WAITING, rows already wait for a slot (the lock is given back at once); WRITING,
        producers hold it (they are writing now); PEER_ASLEEP, another relay holds it (this
        relay LISTENs too)."""
        with translated("taking the stream wake-up lock"):
            row = await self._conn.fetchrow(self.q["stream_sleep_try"])
            assert row is not None  # one row, always
            state, notifying = row["state"], bool(row["notifying"])
            if state == "writing":
                return SleepTry.WRITING, notifying
            if state == "peer":
                return SleepTry.PEER_ASLEEP, notifying
            if await self._conn.fetchval(self.q["stream_sleep_check"]):
                await self._conn.fetchval(self.q["stream_sleep_release"])
                return SleepTry.ROWS_WAITING, notifying
            return SleepTry.ASLEEP, notifying

    async def wake(self) -> None:
        """Give the wake-up lock back: producers stop sending NOTIFYs."""
        with translated("releasing the stream wake-up lock"):
            await self._conn.fetchval(self.q["stream_sleep_release"])
