"""Fair claims between transactions, end to end with a real `relay run`: a row committed by a
one-row transaction is published while a bulk transaction's backlog still drains, not after it
(sql/migrations/0011_fair_claims.sql, query `claim`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import Env, count_rows, pg_session, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows

BULK_ROWS = 50_000
LIVE_ROWS = 20


async def _insert_bulk(dsn: str, exchange: str, rows: int) -> None:
    await insert_rows(dsn, exchange, "rk", ({"bulk": g, "pad": "b" * 150} for g in range(rows)))


async def _produce_live(dsn: str, exchange: str, rows: int, every_s: float,
                        ) -> dict[str, float]:
    """One row per transaction; the commit time of each, by id."""
    committed: dict[str, float] = {}
    async with pg_session(dsn) as conn:
        for i in range(rows):
            [row_id] = await insert_rows(conn, exchange, "rk", [{"live": i}])
            committed[row_id] = time.monotonic()
            await asyncio.sleep(every_s)
    return committed


@pytest.mark.parametrize("express_lane", ["true", "false"])
async def test_fair_claims__live_rows_arrive_while_a_bulk_transaction_drains(
    env: Env, consumer: Consumer, start_relay, express_lane: str
) -> None:
    """With the express lane (the default) and without it (the drain's fair rounds alone)."""
    await _insert_bulk(env.pg_dsn, env.exchange, BULK_ROWS)
    start_relay(poll_interval_s=60, express_lane=express_lane)
    await wait_until(lambda: len(consumer.messages) >= 500, timeout_s=30,
                     what="the relay to start draining the bulk (500 messages)")

    committed = await _produce_live(env.pg_dsn, env.exchange, LIVE_ROWS, every_s=0.02)
    await consumer.wait_for(BULK_ROWS + LIVE_ROWS, timeout_s=90)

    order = consumer.ids
    last_bulk = max(i for i, m in enumerate(order) if m not in committed)
    live_positions = [order.index(i) for i in committed]
    assert max(live_positions) < last_bulk, (
        f"live rows at positions {live_positions} of {len(order)}: one waited for the bulk")
    # How long they waited is the benchmark's to measure (python -m bench --scenario
    # fairness): here only the order, which no load on the machine can turn around.
    waits = sorted(consumer.arrivals[i] - committed[i] for i in committed)
    print(f"live rows waited {waits[0]:.3f}-{waits[-1]:.3f} s from commit to consumer")
    assert consumer.duplicates() == 0
    await wait_until(lambda: _empty(env.pg_dsn), what="an empty outbox")


async def _empty(dsn: str) -> bool:
    return await count_rows(dsn) == 0
