"""The shared RabbitMQ node stops and starts mid-flow: nothing is lost, the outage is logged
once, and the node is running afterwards whatever happens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.chaos.harness import (
    RobustConsumer,
    assert_drained,
    produce,
    rabbitmqctl,
    relays,
    report,
)
from tests.helpers import Env, wait_until

pytestmark = pytest.mark.chaos

OUTAGE_S = 3.0


async def test_rabbitmq_restart__mid_flow_loses_nothing_and_logs_once(
    env: Env, tmp_path: Path
) -> None:
    consumer = await RobustConsumer(env.amqp_url, env.queue).start()
    try:
        with relays(env, tmp_path, reconnect_max_s=2) as group:
            relay = group.start()
            producer = asyncio.ensure_future(produce(env, 10_000, chunk=250, interval_s=0.1))
            await wait_until(lambda: consumer.distinct() > 1000, what="flow before the fault")
            try:
                rabbitmqctl("stop_app")
                await asyncio.sleep(OUTAGE_S)
            finally:
                # The node is shared: it must run again even when this test fails.
                rabbitmqctl("start_app")
            ids = await producer
            await consumer.wait_all(ids, timeout_s=60, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn)
            lost, _duplicates = report("rabbitmq stop_app/start_app", ids, consumer)
            assert lost == 0
            assert relay.alive()
            assert len(group.events("broker_connection_lost")) == 1
            assert len(group.events("broker_reconnected")) == 1
    finally:
        await consumer.stop()
