"""RabbitMQ stops and starts (a private node of the test's own, never the shared one) while
relays hold claimed rows and a producer process keeps inserting: nothing is lost, duplicates
stay within the rows in flight, each outage is logged once by each relay."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import (
    RobustConsumer,
    assert_drained,
    assert_exactly_delivered,
    declare_names,
    fresh_ids,
    insert_with_ids,
    relays,
    report,
)
from tests.chaos.inflight import FaultTally, LockProbe, caught_holding_rows
from tests.chaos.producer import ProducerProcess
from tests.helpers import Env, wait_until
from tests.servers.rabbitmq_node import RabbitNode

pytestmark = pytest.mark.chaos

RESTARTS = 2
REPLICAS = 2
BACKLOG = 5_000
RATE = 500  # rows/s from the producer process, during the outages too


async def test_rabbitmq_restart__mid_batch_loses_nothing_and_duplicates_at_most_rows_in_flight(
    db: str, rabbit_node: RabbitNode, tmp_path: Path
) -> None:
    name = f"relay-chaos-{secrets.token_hex(4)}"
    env = Env(pg_dsn=db, amqp_url=rabbit_node.url, exchange=f"{name}-x", queue=f"{name}-q")
    await declare_names(env)
    backlog = fresh_ids(BACKLOG)
    await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, backlog)
    consumer = await RobustConsumer(env.amqp_url, env.queue).start()
    probe = LockProbe(env.pg_dsn)
    producer = ProducerProcess(env.pg_dsn, env.exchange, env.routing_key, tmp_path / "ids",
                               rate=RATE, chunk=25)
    tally = FaultTally("rabbitmq stop_app")
    try:
        with relays(env, tmp_path, reconnect_max_s=2) as group:

            def broker(name: str) -> list[dict[str, Any]]:
                return group.events(name, connection="broker")

            procs = [group.start() for _ in range(REPLICAS)]
            for p in procs:
                await wait_until(lambda p=p: '"relay_started"' in p.log_text(), what="start")
            await producer.start()
            for n in range(1, RESTARTS + 1):
                async with caught_holding_rows(procs, probe) as held:
                    # Returns once the AMQP listener is closed: every connection dropped.
                    await asyncio.to_thread(rabbit_node.stop_app)
                tally.record(held)
                await wait_until(
                    lambda n=n: len(broker("connection_lost")) == n * REPLICAS,
                    what=f"{n * REPLICAS} connection_lost (broker)")
                await asyncio.to_thread(rabbit_node.start_app)
                await wait_until(
                    lambda n=n: len(broker("connection_restored")) == n * REPLICAS,
                    timeout_s=60, what=f"{n * REPLICAS} connection_restored (broker)")
            ids = backlog + await producer.stop()
            await consumer.wait_all(ids, timeout_s=180, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn)
            outcome = report(f"rabbitmq stop_app/start_app x{RESTARTS}", ids, consumer)
            print(f"[chaos] rabbitmq restart: {tally.summary()}")
            assert tally.in_flight == RESTARTS, tally.summary()
            assert_exactly_delivered(ids, consumer, outcome, tally.rows_in_flight)
            assert all(p.alive() for p in procs)
            assert len(broker("connection_lost")) == RESTARTS * REPLICAS
            assert len(broker("connection_restored")) == RESTARTS * REPLICAS
            assert [p.terminate() for p in procs] == [0] * REPLICAS
    finally:
        producer.kill()
        await probe.close()
        await consumer.stop()
