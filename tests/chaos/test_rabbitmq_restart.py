"""RabbitMQ stops and starts (a private node of the test's own, never the shared one) while
relays hold claimed rows and a producer process keeps inserting: nothing is lost, duplicates
stay within the rows in flight, each outage is logged once by each relay."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.flow import chaos_flow
from tests.chaos.harness import declare_names
from tests.chaos.inflight import caught_holding_rows
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
    async with chaos_flow(env, tmp_path, "rabbitmq stop_app", backlog=BACKLOG, rate=RATE,
                          chunk=25, manual_ack=True, reconnect_max_s=2) as flow:
        group, probe, tally = flow.group, flow.probe, flow.tally

        def broker(name: str) -> list[dict[str, Any]]:
            return group.events(name, connection="broker")

        procs = [group.start() for _ in range(REPLICAS)]
        for p in procs:
            await wait_until(lambda p=p: '"relay_started"' in p.log_text(), what="start")
        await flow.start_producer()
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
        await flow.settle(f"rabbitmq stop_app/start_app x{RESTARTS}", in_flight=RESTARTS,
                          timeout_s=180)
        assert all(p.alive() for p in procs)
        assert len(broker("connection_lost")) == RESTARTS * REPLICAS
        assert len(broker("connection_restored")) == RESTARTS * REPLICAS
        assert [p.terminate() for p in procs] == [0] * REPLICAS
