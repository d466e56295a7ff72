"""Retry backoff and delayed delivery, measured against the real servers: a failing row is not
retried before its time (and not much after), other rows keep flowing meanwhile, and a delayed
row is published when due rather than at the next poll."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.chaos.harness import relays
from tests.helpers import Env, pg_session, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import fresh_ids, insert_rows, insert_with_ids

pytestmark = pytest.mark.chaos

BASE_S = 0.5
# A loaded 2-core machine: wake-up, claim and publish of the retry. Far below the poll (30 s
# here), which a retry that was not woken for would wait.
LATE_TOLERANCE_S = 5.0


@pytest.mark.timing
async def test_retry_timing__backoff_is_respected_and_other_rows_keep_flowing(
    env: Env, tmp_path: Path
) -> None:
    consumer = await Consumer(env.amqp_url, env.queue, robust=True, manual_ack=True).start()
    async with pg_session(env.pg_dsn) as conn:
        with relays(env, tmp_path, retry_base_s=BASE_S, retry_max_s=30, max_attempts=4,
                    poll_interval_s=30) as group:
            group.start()
            [bad_id] = await insert_rows(conn, env.exchange, "nowhere", [{}])
            # attempts -> (planned delay from the row, observed lateness of the next attempt,
            # how long before this look the test looked last: the settle fell in between)
            seen: dict[int, tuple[float, float, float]] = {}
            looked = time.monotonic()
            last = (0, None)
            flow: asyncio.Future[float] | None = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = await conn.fetchrow(
                    "SELECT attempts, available_at, now() AS now, "
                    "EXTRACT(EPOCH FROM available_at - now())::float8 AS wait_s "
                    "FROM queue_message WHERE id = $1", bad_id)
                if row is None:
                    break  # dead-lettered after the last attempt
                gap, looked = time.monotonic() - looked, time.monotonic()
                if row["attempts"] != last[0]:
                    prev_due = last[1]
                    late = (row["now"] - prev_due).total_seconds() if prev_due else 0.0
                    seen[row["attempts"]] = (row["wait_s"], late, gap)
                    last = (row["attempts"], row["available_at"])
                    if row["attempts"] == 2 and flow is None:
                        # While the bad row waits for its retry, good rows go straight through
                        # (checked beside the polling, which must not be held up by it).
                        flow = asyncio.ensure_future(_good_rows_flow(env, consumer))
                await asyncio.sleep(0.02)
            dead_at_attempts = await conn.fetchval(
                "SELECT attempts FROM queue_message_dead WHERE id = $1", bad_id)
        print(f"[chaos] retry schedule (attempt: planned wait s, observed lateness s): {seen}")
        assert dead_at_attempts == 4
        assert sorted(seen) == [1, 2, 3]
        for attempts, (wait_s, _late, gap) in seen.items():
            ceiling = BASE_S * 2 ** (attempts - 1)
            # planned delay: half fixed, half jitter; the test saw it up to `gap` after the
            # settle set it (a loaded machine lengthens the gap, never the delay)
            assert ceiling / 2 - gap - 0.05 <= wait_s <= ceiling + 0.01, (attempts, wait_s, gap)
        for attempts in (2, 3):
            late = seen[attempts][1]
            # Never before the planned time (the claim filters on available_at <= now()).
            assert -0.05 <= late <= LATE_TOLERANCE_S, (attempts, late)
        assert flow is not None
        flow_s = await flow
        print(f"[chaos] 200 good rows delivered in {flow_s:.2f}s while a row waited")
        # Not queued behind the failing row: 200 rows take well under a second alone; 5 s
        # leaves room for a loaded machine.
        assert flow_s <= 5.0, flow_s
        await consumer.stop()


async def _good_rows_flow(env: Env, consumer: Consumer) -> float:
    ids = fresh_ids(200)
    start = time.monotonic()
    await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, ids)
    await consumer.wait_all(ids, timeout_s=10)
    return time.monotonic() - start


async def test_delayed_delivery__published_when_due_not_at_the_next_poll(
    env: Env, tmp_path: Path
) -> None:
    consumer = await Consumer(env.amqp_url, env.queue, robust=True, manual_ack=True).start()
    async with pg_session(env.pg_dsn) as conn:
        with relays(env, tmp_path, poll_interval_s=30) as group:
            relay = group.start()
            await wait_until(lambda: '"relay_started"' in relay.log_text(), what="start")
            # The server sets available_at at some moment inside the INSERT's round trip:
            # the row is due between (sent + delay) and (answered + delay) on our clock.
            due: dict[str, tuple[float, float]] = {}
            for delay_s in (1.5, 3.0, 4.5):
                sent = time.monotonic()
                [rid] = await insert_rows(conn, env.exchange, env.routing_key, [{}],
                                          delay_s=delay_s)
                due[rid] = (sent + delay_s, time.monotonic() + delay_s)
            await consumer.wait_all(list(due), timeout_s=20)
        early = {rid: consumer.arrivals[rid] - first for rid, (first, _) in due.items()}
        late = {rid: consumer.arrivals[rid] - last for rid, (_, last) in due.items()}
        print(f"\n[chaos] delayed delivery lateness (s): "
              f"{sorted(round(v, 3) for v in late.values())}")
        for rid in due:
            assert early[rid] >= -0.05, "published before it was due"
            assert late[rid] <= LATE_TOLERANCE_S
        await consumer.stop()
