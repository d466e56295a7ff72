"""Soak: 3 relays, 100,000 rows, faults mid-flow, a consumer that counts every receipt.

Faults, while rows flow: every relay's broker connection is closed by the broker
(`rabbitmqctl close_connection`, chosen by the relays' own connection names: the shared node's
other connections are left alone), and worker sessions caught mid-batch are terminated
(`pg_terminate_backend`, one per relay at most), so a lane fails while its siblings have batches
in flight.
Asserts 0 lost, duplicates bounded by what was in flight at the faults, one reconnect per relay,
and prints the counts.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from typing import Any

import pytest

from tests.helpers import Env, RelayProcess, count_rows, pg_session, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows

pytestmark = pytest.mark.soak

ROWS = 100_000
CHUNK = 2_000
RELAYS, CONCURRENCY, BATCH = 3, 3, 500


async def _produce(dsn: str, exchange: str) -> None:
    async with pg_session(dsn) as conn:
        for start in range(0, ROWS, CHUNK):
            await insert_rows(conn, exchange, "rk", ({"n": g} for g in range(start, start + CHUNK)))
            await asyncio.sleep(0.3)


def _relay_connections(pids: set[int]) -> list[str]:
    """Broker-side ids (Erlang pids) of the connections these relay processes opened."""
    out = subprocess.run(["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    found = []
    for line in out.splitlines():
        pid, _, props = line.partition("\t")
        name = re.search(r'\{"connection_name","outbox-relay \S+ (\d+)"\}', props)
        if name is not None and int(name.group(1)) in pids:
            found.append(pid)
    return found


def _close_connections(names: list[str]) -> None:
    for name in names:
        subprocess.run(["rabbitmqctl", "-q", "close_connection", name, "soak: forced close"],
                       capture_output=True, timeout=60, check=True)


async def _terminate_one_worker_session_each(dsn: str, pids: set[int]) -> int:
    async with pg_session(dsn) as conn:
        rows = await conn.fetch(
            "SELECT DISTINCT ON (split_part(application_name, ' ', 4)) pid, application_name "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'outbox-relay worker %' AND state = 'idle in transaction' "
            "ORDER BY split_part(application_name, ' ', 4), pid")
        mine = [r["pid"] for r in rows if int(r["application_name"].split(" ")[-1]) in pids]
        for pid in mine:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
        return len(mine)


def _broker_restored(relays: list[RelayProcess]) -> list[dict[str, Any]]:
    """The supervisor's connection_restored lines about the relays' broker connections."""
    return [e for r in relays for e in r.log_events()
            if e.get("event") == "connection_restored" and e.get("connection") == "broker"]


async def test_soak__three_relays_100k_rows_broker_close_and_lane_failure_lose_nothing(
    env: Env, consumer: Consumer, start_relay
) -> None:
    started = time.monotonic()
    relays = [start_relay(batch_size=BATCH, concurrency=CONCURRENCY) for _ in range(RELAYS)]
    pids = {r.pid for r in relays}
    await wait_until(lambda: len(_relay_connections(pids)) == RELAYS, timeout_s=60,
                     interval_s=1, what="every relay connected to the broker")
    producer = asyncio.ensure_future(_produce(env.pg_dsn, env.exchange))

    # While rows flow: a worker session caught mid-batch (idle in transaction while its batch
    # publishes) is terminated, so its lane fails while the relay's other lanes hold batches.
    terminated, deadline = 0, time.monotonic() + 30
    while not terminated and time.monotonic() < deadline:
        terminated = await _terminate_one_worker_session_each(env.pg_dsn, pids)
        await asyncio.sleep(0.01)

    await consumer.wait_for(ROWS // 2, timeout_s=90)
    closed = _relay_connections(pids)
    await asyncio.to_thread(_close_connections, closed)
    await wait_until(lambda: len(_broker_restored(relays)) >= len(closed), timeout_s=60,
                     what="every relay reconnected")

    await producer
    await consumer.wait_for(ROWS, timeout_s=120)
    await wait_until(lambda: _empty(env), timeout_s=60, what="an empty outbox")
    await asyncio.sleep(0.5)  # a straggling duplicate arrives before the count
    ids = consumer.ids
    distinct, duplicates = len(set(ids)), len(ids) - len(set(ids))
    in_flight_bound = (len(closed) + terminated) * CONCURRENCY * BATCH
    print(f"\nsoak: {ROWS} rows, {RELAYS} relays: delivered {distinct}, lost {ROWS - distinct}, "
          f"duplicates {duplicates} (bound {in_flight_bound}); broker connections closed "
          f"{len(closed)}, worker sessions terminated {terminated}; "
          f"{time.monotonic() - started:.0f} s")
    assert distinct == ROWS, f"lost {ROWS - distinct} rows"
    assert duplicates <= in_flight_bound
    assert len(closed) == RELAYS
    assert terminated >= 1, "no worker session was caught mid-batch"
    assert len(_broker_restored(relays)) == len(closed), "one reconnect per closed connection"
    assert await count_rows(env.pg_dsn, "queue_message_dead") == 0
    assert [r.terminate() for r in relays] == [0] * RELAYS


async def _empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0
