"""What a stream slot's producer is called, and what the broker's mark for it proves.

The broker keeps, per producer name and stream, the highest publishing id it stored (its mark)
and drops, confirming it, any message at or below it. Two rules keep that from ever costing a
row (docs/streams.md, "What the broker's mark proves"):

- a name is the outbox's own (`<table>-<identity>-<slot>`): no other outbox can raise its mark;
- before a slot gives ids in a stream or sends to it on a connection, it asks for the mark
  (sync): no id at or below it is given again, and the slot's rows at or below it are deleted
  unsent only when the database itself gave that id (it is no higher than the last id given);
  a mark above every id given means the database went back (a restore, a failover to a standby
  that lagged), and those rows are sent again with new ids: a duplicate at worst.
"""

from __future__ import annotations

import hashlib

import structlog

from relay.pg.streams import StreamStore
from relay.streams.producer import SlotProducer

log = structlog.get_logger("relay.streams")
# Hex digits of the outbox's identity in a producer name.
IDENTITY_DIGITS = 12


def producer_name(table: str, identity: str, slot: int) -> str:
    """The stream producer name of `slot` of the outbox `identity` (StreamStore.identity):
    `<table>-<12 hex digits>-<slot>`. Unique per outbox, the same on every relay of it and
    after any restart or failover."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:IDENTITY_DIGITS]
    return f"{table}-{digest}-{slot}"


def old_producer_name(table: str, slot: int) -> str:
    """The name `slot` had before sql/migrations/0022: `<table>-<slot>`, the same in every
    outbox with that table name."""
    return f"{table}-{slot}"


async def _reconcile(store: StreamStore, slot: int, stream: str, *, mark: int, given: int,
                     name: str) -> None:
    """The broker stored up to `mark` for producer `name` in `stream`; the database gave ids up
    to `given` under that name. A mark the database gave: the slot's rows at or below it were
    stored, deleted unsent. A mark above every id given (the database went back: a restore, a
    failover to a standby that lagged; or another outbox used the name): which rows the broker
    stored cannot be told, so those at or below it are sent again with new ids, counted."""
    if mark <= given:
        settled = await store.settle_stored(slot, stream, mark)
        if settled:
            log.info("stream_rows_stored_before", slot=slot, stream=stream, producer=name,
                     last_publishing_id=mark, rows=settled)
        return
    again = await store.send_again(slot, stream, mark, mark)
    log.warning("stream_mark_ahead_of_database", slot=slot, stream=stream, producer=name,
                broker_mark=mark, last_given=given, rows_sent_again=again)


async def sync(store: StreamStore, producer: SlotProducer, slot: int, stream: str, *,
               old_name: str) -> None:
    """Step 1: learn the broker's mark for the slot's name in `stream`; settle or send again
    the rows at or below it; give no id at or below it. Rows given ids under the slot's old
    name (`old_name`, before sql/migrations/0022) first, by that name's mark."""
    old_last = await store.legacy_of(slot, stream)
    if old_last is not None:
        old_mark = await producer.last_stored(stream, old_name)
        await _reconcile(store, slot, stream, mark=old_mark, given=old_last, name=old_name)
        await store.legacy_done(slot, stream)
    mark = await producer.last_stored(stream)
    await _reconcile(store, slot, stream, mark=mark,
                     given=await store.last_given(slot, stream), name=producer.name)
    producer.synced.add(stream)
