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
WINDOW_S = 12.0
STATS_FLUSH_S = 11.0
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
# How many slots each relay holds now (the default 4 slots share out 2 and 2 between 2 relays).
SLOT_SHARES = ("SELECT coalesce(array_agg(n ORDER BY n), '{}') FROM (SELECT count(*) AS n "
               "FROM queue_message_stream_slots WHERE owner IS NOT NULL AND lease_until > now() "
               "GROUP BY owner) AS shares")


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
            # The first relay up takes every slot and gives one back each lease quarter (2.5 s)
            # once it sees the second: the window starts after the hand-over, not during it.
            await wait_until(lambda: _shared_evenly(conn), timeout_s=60,
                             what="the 4 stream slots shared 2 and 2 between the relays")
            await wait_until(lambda: _one_sleeper(conn), timeout_s=30,
                             what="a relay asleep on the stream table's wake-up lock")
        # A backend that committed within a second of its last report keeps its counts up to
        # 10 s before it reports them (PGSTAT_IDLE_INTERVAL): counted from an earlier start, the
        # window took in the start-up's transactions. Past 10 s idle, what is counted is idle.
        await asyncio.sleep(STATS_FLUSH_S)
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


async def _shared_evenly(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval(SLOT_SHARES) == [2, 2])


async def _one_sleeper(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval(STREAM_SLEEPERS) == 1)
