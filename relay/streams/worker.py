"""The stream worker: slots leased, rows given publishing ids, sent in order, settled.

Each relay with RELAY_STREAMS=true runs one. It notes itself alive, takes free slots up to its
share (slots / stream relays alive), and for each slot it owns runs one loop:

1. before the slot gives ids in a stream or sends to it on a connection, it asks the broker for
   the highest publishing id it stored for the slot's producer name there (its mark; marks.sync):
   when the database gave that id, the slot's rows at or below it were stored (their sender
   died before deleting them) and are deleted unsent; when the mark is above every id the
   database gave (a restore, a failover to a standby that lagged), those rows are sent again
   with new ids; either way no id at or below the mark is given again;
2. renew the lease and give unassigned rows of streams whose mark it knows the slot's next
   publishing ids, in one committed transaction;
3. send the slot's rows in publishing id order, per stream; delete what the broker confirmed
   (a duplicate is confirmed and not written); rows it refused get new ids; rows it did not
   answer are sent again, same ids, at the next round; a row too large for any publish frame
   is parked in the stream dead letters with its reason, never sent.

A lost lease stops the slot's loop at once; the new owner starts at step 1. A slot's producer
is named after the outbox (`<table>-<identity>-<slot>`, producer_name): two outboxes writing to
one stream never share a name, so never the broker's mark.

A slot with nothing to send looks again soon, less often the longer it stays so (at most every
IDLE_MAX_S); after IDLE_CHECK_S without a word from the broker it asks the broker something, and
gives its connection up when no answer comes within the confirm timeout, so a link cut without
a word while nothing was sent is found before rows come, not by their unanswered sends.

When every slot of the relay is idle, the relay also takes the stream table's wake-up lock on a
connection that LISTENs (sql/migrations/0019): producers' INSERTs then send a NOTIFY, which
wakes the slots at once; the first slot that finds rows gives the lock back. While this relay
or another holds it (every relay LISTENs), an idle slot looks only at a third of its lease (to
renew it) unless a NOTIFY comes: an idle stream table costs the database a few transactions a
second per relay, not one per slot every IDLE_MAX_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import groupby

import structlog

from relay.errors import RelayError
from relay.pg.streams import SleepTry, StreamRow, StreamStore
from relay.streams.marks import old_producer_name, producer_name, sync
from relay.streams.producer import (
    SILENT_SENDS,
    Outgoing,
    SlotProducer,
    StreamGone,
    StreamLinkSilent,
    StreamServer,
)

log = structlog.get_logger("relay.streams")

# Bytes of bodies per publish frame (the connection's frame_max is 1 MiB).
FRAME_BODY_BYTES = 512 * 1024
# The longest pause between looks of an idle slot: the most a row for a stream waits.
IDLE_MAX_S = 0.5
# An idle slot that heard nothing from the broker for this long checks its connection.
IDLE_CHECK_S = 10.0
# While a relay sleeps on the wake-up lock (this one or another: a NOTIFY wakes every relay),
# an idle slot looks only to renew its lease (at a third of it) and to check its link.
ASLEEP_LOOKS_PER_LEASE = 3
# A producer holds the wake-up lock shared while its INSERT's transaction is open (it saw no
# relay asleep and sent no NOTIFY): look again this soon, a few times, for its rows.
PRODUCER_WRITING_S = 0.005
PRODUCER_WRITING_LOOKS = 3
# A stream that cannot take messages (missing, no leader, this user may not write to it, its
# messages refused) is tried again after this, doubling up to STREAM_RETRY_MAX_S: the most its
# rows wait after it can take them again.
STREAM_RETRY_FIRST_S = 0.5
STREAM_RETRY_MAX_S = 10.0


@dataclass
class _Wait:
    """A stream's pause: the current delay, and when it is tried again."""

    delay_s: float = STREAM_RETRY_FIRST_S
    retry_at: float = 0.0


@dataclass(frozen=True)
class StreamConfig:
    """slots: producer names shared by every relay (the same on all); lease_s: how long a
    relay that stopped answering keeps its slots; batch: rows per round; idle_s: the pause when
    a slot has nothing to send; confirm_timeout_s: how long a send waits for answers."""

    server: StreamServer
    producer_prefix: str
    slots: int = 4
    lease_s: float = 10.0
    batch: int = 1000
    idle_s: float = 0.05
    confirm_timeout_s: float = 10.0


class StreamWorker:
    """Runs until cancelled; `open_store()` gives a StreamStore on a connection of its own."""

    def __init__(self, config: StreamConfig,
                 open_store: Callable[[], Awaitable[StreamStore]]) -> None:
        self.config = config
        self._open_store = open_store
        self._slots: dict[int, asyncio.Task[None]] = {}
        # The wake-up: a connection that LISTENs and holds the wake-up lock while asleep.
        self._waker: StreamStore | None = None
        self._waker_busy = asyncio.Lock()
        self._asleep = False
        self._peer_asleep = False  # another relay holds the wake-up lock (it sleeps)
        self._notifying = False  # producers' INSERTs NOTIFY a sleeper (RELAY_NOTIFY not off)
        self._producer_writing = 0  # quick looks taken since the lock was last refused
        # Streams that cannot take messages now (missing, refused): when each is tried again.
        self._waiting: dict[str, _Wait] = {}
        self._idle: set[int] = set()
        self._notified = asyncio.Event()

    async def run(self) -> None:
        """Share the slots with the other relays, each owned slot in a task of its own. The
        connection that notes this relay alive and takes slots is opened again when it fails
        (the server down, restarted or failed over, the session ended by an admin): said once
        when it fails, once when it works again."""
        cfg = self.config
        store: StreamStore | None = None
        failing = False
        try:
            while True:
                try:
                    if store is None:
                        store = await self._open_store()
                        await store.ensure_slots(cfg.slots)
                    await self._rebalance(store)
                except RelayError as exc:
                    if not failing:
                        log.warning("stream_slots_unavailable", error=str(exc))
                    failing = True
                    if store is not None:
                        store.terminate()  # a new session at the next look
                        store = None
                else:
                    if failing:
                        log.info("stream_slots_available")
                    failing = False
                if self._waker is None:
                    await self._open_waker()
                await asyncio.sleep(cfg.lease_s / 4)
        finally:
            for task in self._slots.values():
                task.cancel()
            for task in self._slots.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.close()
            await self._drop_waker()

    async def close(self) -> None:
        """Nothing to close: run() closes what it opened when cancelled."""

    async def _rebalance(self, store: StreamStore) -> None:
        cfg = self.config
        for slot, task in list(self._slots.items()):
            if task.done():
                del self._slots[slot]
        relays = await store.heartbeat(cfg.lease_s)
        share = math.ceil(cfg.slots / max(relays, 1))
        while len(self._slots) < share:
            taken = await store.take_slot(cfg.lease_s, cfg.slots)
            if taken is None:
                break
            log.info("stream_slot_taken", slot=taken, relays=relays)
            self._slots[taken] = asyncio.create_task(self._own(taken))
        if len(self._slots) > share:  # another relay came: give back the highest
            highest = max(self._slots)
            self._slots.pop(highest).cancel()
            log.info("stream_slot_given_back", slot=highest, relays=relays)

    async def _open_waker(self) -> None:
        try:
            waker = await self._open_store()
        except RelayError as exc:
            log.warning("stream_wakeup_unavailable", error=str(exc))
            return
        try:
            await waker.listen(self._on_notify)
        except RelayError as exc:
            log.warning("stream_wakeup_unavailable", error=str(exc))
            with contextlib.suppress(Exception):
                await waker.close()
            return
        self._waker = waker

    async def _drop_waker(self) -> None:
        """Close the wake-up connection (its lock goes with it); slots poll meanwhile."""
        waker, self._waker, self._asleep = self._waker, None, False
        self._peer_asleep = False
        if waker is not None:
            with contextlib.suppress(Exception):
                await waker.close()

    def _on_notify(self) -> None:
        woken, self._notified = self._notified, asyncio.Event()
        woken.set()

    async def _idle_wait(self, slot: int, timeout_s: float) -> None:
        """A slot found nothing: wait `timeout_s`, or less if a NOTIFY comes. The last slot of
        the relay to go idle takes the wake-up lock (no row can then arrive unannounced).
        While this relay or another sleeps on it, the wait is long: a NOTIFY ends it."""
        woken = self._notified
        self._idle.add(slot)
        try:
            if self._idle >= set(self._slots) and not self._asleep:
                async with self._waker_busy:
                    if self._waker is not None and not self._asleep:
                        try:
                            found, notifying = await self._waker.try_sleep()
                        except RelayError as exc:
                            log.warning("stream_wakeup_lost", error=str(exc))
                            await self._drop_waker()
                            found, notifying = SleepTry.WRITING, False  # poll, no waker
                        if found is SleepTry.ROWS_WAITING:
                            return
                        self._asleep = found is SleepTry.ASLEEP
                        # A long wait only while a NOTIFY can end it.
                        self._peer_asleep = found is SleepTry.PEER_ASLEEP and notifying
                        self._notifying = notifying
                        if found is SleepTry.WRITING:
                            if self._producer_writing < PRODUCER_WRITING_LOOKS:
                                self._producer_writing += 1
                                timeout_s = PRODUCER_WRITING_S
                        else:
                            self._producer_writing = 0
            if (self._asleep or self._peer_asleep) and self._notifying \
                    and self._waker is not None and not self._waiting:
                timeout_s = max(timeout_s, self._asleep_look_s())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await woken.wait()
        finally:
            self._idle.discard(slot)

    def _asleep_look_s(self) -> float:
        """An idle slot's wait while a relay sleeps on the wake-up lock."""
        return min(self.config.lease_s / ASLEEP_LOOKS_PER_LEASE, IDLE_CHECK_S)

    async def _awake(self) -> None:
        """A slot found rows: give the wake-up lock back (no NOTIFY is needed while busy)."""
        self._producer_writing = 0
        self._peer_asleep = False
        if not self._asleep:
            return
        async with self._waker_busy:
            if self._asleep and self._waker is not None:
                try:
                    await self._waker.wake()
                    self._asleep = False
                except RelayError as exc:
                    log.warning("stream_wakeup_lost", error=str(exc))
                    await self._drop_waker()

    async def _own(self, slot: int) -> None:
        """One slot's loop, from takeover until the lease is lost or the task cancelled."""
        cfg = self.config
        store: StreamStore | None = None
        producer: SlotProducer | None = None
        try:
            store = await self._open_store()
            identity = await store.identity()
            producer = SlotProducer(cfg.server, producer_name(cfg.producer_prefix, identity,
                                                              slot))
            await producer.start()
            idle = cfg.idle_s
            while True:
                await self._sync_unassigned(store, producer, slot)
                assigned = await store.assign(slot, cfg.lease_s, cfg.batch,
                                              sorted(producer.synced))
                if assigned is None:
                    log.warning("stream_slot_lease_lost", slot=slot)
                    return
                rows = await self._sendable(store, producer, slot)
                if rows:
                    await self._awake()
                    if await self._send(store, producer, rows):
                        idle = cfg.idle_s
                        continue
                    # Nothing went (their streams cannot take messages): try again later.
                    await asyncio.sleep(idle)
                else:
                    if time.monotonic() - producer.heard_at >= IDLE_CHECK_S:
                        await producer.check(cfg.confirm_timeout_s)
                    # Nothing to send: look again soon (at once on a NOTIFY).
                    await self._idle_wait(slot, idle)
                # Less often the longer it stays so.
                idle = min(idle * 2, IDLE_MAX_S, cfg.lease_s / 3)
        except (RelayError, OSError, ConnectionError) as exc:
            log.warning("stream_slot_failed", slot=slot, error=str(exc) or repr(exc))
            await asyncio.sleep(1.0)
        except Exception as exc:  # a bug or a client library surprise: said, slot given back
            log.error("stream_slot_failed", slot=slot, error=repr(exc), exc_info=True)
            await asyncio.sleep(1.0)
        finally:
            if producer is not None:
                with contextlib.suppress(Exception):
                    await producer.close()
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.release(slot)
                with contextlib.suppress(Exception):
                    await store.close()

    def _paused(self) -> set[str]:
        """Streams in their pause now (they took no message, or their mark was unknown)."""
        now = time.monotonic()
        return {stream for stream, wait in self._waiting.items() if now < wait.retry_at}

    async def _sync_unassigned(self, store: StreamStore, producer: SlotProducer,
                               slot: int) -> None:
        """Step 1 for the streams of the rows the slot may assign next: ids are given only in
        streams whose mark the slot knows on this connection (a stream whose mark the broker
        cannot tell keeps its rows unassigned, in its pause)."""
        known = sorted(producer.synced | self._paused())
        for stream in await store.unsynced(known, self.config.batch):
            await self._try_sync(store, producer, slot, stream)

    async def _sendable(self, store: StreamStore, producer: SlotProducer,
                        slot: int) -> list[StreamRow]:
        """The slot's rows to send now: those of streams whose mark the slot knows on this
        connection (step 1 first for the others: a takeover's, or a new connection's)."""
        rows = await store.assigned(slot, self.config.batch)
        unknown = {r.stream for r in rows} - producer.synced - self._paused()
        if unknown:
            for stream in sorted(unknown):
                await self._try_sync(store, producer, slot, stream)
            rows = await store.assigned(slot, self.config.batch)  # some settled or renumbered
        return [r for r in rows if r.stream in producer.synced]

    async def _try_sync(self, store: StreamStore, producer: SlotProducer, slot: int,
                        stream: str) -> None:
        """Step 1 for one stream; one whose mark the broker cannot tell pauses."""
        try:
            await sync(store, producer, slot, stream,
                       old_name=old_producer_name(self.config.producer_prefix, slot))
        except StreamGone as exc:
            self._stream_waits(stream, "stream_missing", error=str(exc))

    async def _send(self, store: StreamStore, producer: SlotProducer,
                    rows: list[StreamRow]) -> bool:
        """Send the rows, stream by stream; whether any row was settled, refused or parked. A
        stream that cannot take messages is tried again after a pause of its own (doubling to
        STREAM_RETRY_MAX_S); its rows wait meanwhile, the slot's other streams go."""
        progressed = False
        for stream, group in groupby(rows, key=lambda r: r.stream):
            wait = self._waiting.get(stream)
            if wait is not None and time.monotonic() < wait.retry_at:
                continue
            outgoing = [Outgoing(r.id, r.body, r.publishing_id) for r in group]
            sendable = await self._park_too_large(store, producer, stream, outgoing)
            progressed = progressed or len(sendable) < len(outgoing)
            for frame in _frames(sendable):
                try:
                    result = await producer.send(stream, frame, self.config.confirm_timeout_s)
                except StreamGone as exc:
                    self._stream_waits(stream, "stream_missing", error=str(exc))
                    break
                progressed = progressed or bool(result.confirmed or result.refused)
                await store.settle(result.confirmed)
                await store.reassign(result.refused)
                if result.refused:
                    # Each gets a new id (its old one might be at or below what the broker
                    # stores meanwhile); the stream pauses before they go again, on a new
                    # client (the refusal may be of a publisher the broker no longer knows).
                    self._stream_waits(stream, "stream_rows_refused", rows=len(result.refused))
                    await producer.start_afresh(stream)
                    break
                if stream in self._waiting:
                    del self._waiting[stream]
                    log.info("stream_available", stream=stream)
                if result.unanswered:
                    # Sent again, same ids, next round; later frames would skip past them.
                    log.warning("stream_rows_unanswered", stream=stream,
                                rows=len(result.unanswered))
                    if producer.silent_sends >= SILENT_SENDS:
                        raise StreamLinkSilent(
                            f"no answer from the broker to {producer.silent_sends} sends in a "
                            f"row ({self.config.confirm_timeout_s:g} s each): the stream "
                            "connection is given up")
                    return progressed
        return progressed

    def _stream_waits(self, stream: str, event: str, **details: object) -> None:
        """`stream` took no message: said once (until it takes messages again), tried again
        after its next pause."""
        wait = self._waiting.get(stream)
        if wait is None:
            log.warning(event, stream=stream, retry_in_s=STREAM_RETRY_FIRST_S, **details)
            wait = self._waiting[stream] = _Wait()
        else:
            wait.delay_s = min(wait.delay_s * 2, STREAM_RETRY_MAX_S)
        wait.retry_at = time.monotonic() + wait.delay_s

    async def _park_too_large(self, store: StreamStore, producer: SlotProducer, stream: str,
                              rows: list[Outgoing]) -> list[Outgoing]:
        """Park the rows no publish frame of the connection can carry; the others.

        The stream protocol forbids a frame over the frame_max both sides agreed on; a broker
        that checks closes the connection, and the row, sent again at every try, would hold its
        slot's later rows for ever (RabbitMQ 3.10 lets such a frame through when it arrives in
        parts; the relay keeps to the protocol either way)."""
        too_large, limit = producer.too_large(rows)
        for row, size in too_large:
            await store.park([row.id], f"message of {size:,} bytes is over the stream "
                             f"connection's frame_max of {limit:,} bytes (raise RabbitMQ's "
                             "stream.frame_max to send it)")
            log.error("stream_row_parked", stream=stream, id=row.id, bytes=size,
                      frame_max=limit)
        parked = {row.id for row, _ in too_large}
        return [r for r in rows if r.id not in parked]


def _frames(rows: list[Outgoing]) -> list[list[Outgoing]]:
    """The rows in publish frames of at most FRAME_BODY_BYTES of bodies each."""
    frames: list[list[Outgoing]] = [[]]
    size = 0
    for r in rows:
        if frames[-1] and size + len(r.body) > FRAME_BODY_BYTES:
            frames.append([])
            size = 0
        frames[-1].append(r)
        size += len(r.body)
    return [f for f in frames if f]
