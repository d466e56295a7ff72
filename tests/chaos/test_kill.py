"""kill -9 of relay replicas while they hold claimed rows, with a producer in its own process:
nothing is lost, no row stays locked, and the relay's duplicates never exceed the rows the
killed processes held at the instant they died."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.chaos.harness import (
    RobustConsumer,
    assert_drained,
    assert_exactly_delivered,
    fresh_ids,
    insert_with_ids,
    relays,
    report,
)
from tests.chaos.inflight import FaultTally, Held, LockProbe, caught_holding_rows
from tests.chaos.producer import ProducerProcess
from tests.helpers import Env, RelayProcess, wait_until

pytestmark = pytest.mark.chaos

KILLS = 6
BACKLOG = 5_000
RATE = 800  # rows/s from the producer process, on top of the backlog


async def kill_mid_batch(victim: RelayProcess, probe: LockProbe) -> Held:
    """kill -9 the victim, frozen at an instant it holds claimed rows: the rows sampled are
    exactly what it held when it died. A replica busy with the backlog and the producer is
    caught within a fraction of a second; 5 s without a claim is a finding in itself."""
    # A replica still starting (seconds on a loaded machine) holds nothing yet.
    await wait_until(lambda: '"relay_started"' in victim.log_text(), timeout_s=60,
                     what="the victim started")
    async with caught_holding_rows([victim], probe, timeout_s=5) as held:
        os.kill(victim.pid, signal.SIGKILL)
        victim.kill()  # reap it
    return held


async def test_kill9__replicas_killed_holding_rows_lose_nothing_and_duplicate_at_most_those_rows(
    env: Env, tmp_path: Path
) -> None:
    backlog = fresh_ids(BACKLOG)
    await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, backlog)
    consumer = await RobustConsumer(env.amqp_url, env.queue, manual_ack=False).start()
    probe = LockProbe(env.pg_dsn)
    producer = ProducerProcess(env.pg_dsn, env.exchange, env.routing_key, tmp_path / "ids",
                               rate=RATE, chunk=50)
    tally = FaultTally("kill -9")
    try:
        with relays(env, tmp_path) as group:
            replicas = [group.start(), group.start()]
            await producer.start()
            for k in range(KILLS):
                tally.record(await kill_mid_batch(replicas[k % 2], probe))
                replicas[k % 2] = group.start()
            ids = backlog + await producer.stop()
            await consumer.wait_all(ids, timeout_s=120, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn)
            outcome = report(f"kill -9 x{KILLS}", ids, consumer)
            print(f"[chaos] kill -9: {tally.summary()}")
            assert tally.in_flight == KILLS, tally.summary()
            assert_exactly_delivered(ids, consumer, outcome, tally.rows_in_flight)
            assert all(p.alive() for p in replicas)
            # A process still importing has no SIGTERM handler yet: let it finish starting.
            for p in replicas:
                await wait_until(lambda p=p: '"relay_started"' in p.log_text(), what="start")
            assert [p.terminate() for p in replicas] == [0, 0]
    finally:
        producer.kill()
        await probe.close()
        await consumer.stop()
