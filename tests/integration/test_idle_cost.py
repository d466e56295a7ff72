"""An idle outbox costs the database almost nothing: with only delayed rows left, two relays
sleep until the earliest due time or a NOTIFY, stream slots included (while a relay sleeps on
the stream table's wake-up lock, an idle slot looks only to renew its lease). Counted from the
server's transaction counters of the test's own database, then a row of each kind still goes
at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.helpers import Env, RelayProcess, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows
from tests.kit.stream import a_stream, insert_stream_rows, read_stream

RELAYS = 2
WINDOW_S = 15.0
# Transactions a second per idle relay, the test's own few statements included. Measured on a
# 2-core machine: about 0.4 without streams, 3 with the default 4 stream slots (1 relay) or 2
# each (2 relays); 13 each when idle slots looked every half second whatever the wake-up lock.
BOUND_PER_RELAY = 5.0
XACTS = ("SELECT xact_commit + xact_rollback FROM pg_stat_database "
         "WHERE datname = current_database()")
STREAM_SLEEPERS = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                   "AND mode = 'ExclusiveLock' AND objid = 'queue_message_stream'::regclass::oid "
                   "AND database = (SELECT oid FROM pg_database "
                   "WHERE datname = current_database())")


@pytest.fixture
async def stream() -> AsyncIterator[str]:
    async with a_stream(f"relay-test-{uuid.uuid4().hex[:10]}") as name:
        yield name


def _started(proc: RelayProcess, streams: bool) -> bool:
    events = {e.get("event") for e in proc.log_events()}
    return "relay_started" in events and (not streams or "stream_slot_taken" in events)


@pytest.mark.parametrize("streams", [False, True], ids=["outbox", "outbox and streams"])
async def test_idle__relays_with_only_delayed_rows_make_a_few_transactions_a_second(
    env: Env, consumer: Consumer, start_relay, stream: str, streams: bool,
) -> None:
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                      ({"n": i} for i in range(50)), delay_s=3600)
    # The poll interval a user gets (the tests' default is shorter).
    procs = [start_relay(streams=str(streams).lower(), poll_interval_s=5)
             for _ in range(RELAYS)]
    await wait_until(lambda: all(_started(p, streams) for p in procs), timeout_s=60,
                     what="both relays started (and holding stream slots)")
    conn = await asyncpg.connect(env.pg_dsn)
    try:
        if streams:
            await wait_until(lambda: _one_sleeper(conn), timeout_s=30,
                             what="a relay asleep on the stream table's wake-up lock")
        # Slots share out between the relays at the lease's quarter (2.5 s): past it, idle.
        await asyncio.sleep(3.0)
        before, started = await conn.fetchval(XACTS), time.monotonic()
        await asyncio.sleep(WINDOW_S)
        after, elapsed = await conn.fetchval(XACTS), time.monotonic() - started
    finally:
        await conn.close()
    per_relay = (after - before) / elapsed / RELAYS
    assert per_relay <= BOUND_PER_RELAY, f"{per_relay:.1f} transactions/s per idle relay"
    assert all(p.alive() for p in procs)

    # Asleep, not stuck: a row due now goes, and so does a row for a stream.
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"live": True}])
    await consumer.wait_for(1, timeout_s=30)
    assert consumer.ids == ids
    if streams:
        rows = await insert_stream_rows(env.pg_dsn, stream, 1)
        got = await read_stream(stream, at_least=1, timeout_s=30)
        assert [m["id"] for m in got] == rows


async def _one_sleeper(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval(STREAM_SLEEPERS) == 1)
