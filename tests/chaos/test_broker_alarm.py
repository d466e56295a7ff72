"""A memory alarm on the relay's broker (a private node of the test's own: an alarm blocks
every publisher of a node): the relay claims nothing and counts no attempt while blocked, and
delivers once the alarm clears."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import pytest

from tests.chaos.flow import chaos_flow
from tests.chaos.harness import declare_names
from tests.helpers import Env, pg_fetch, wait_until
from tests.kit.producer import fresh_ids, insert_with_ids
from tests.servers.rabbitmq_node import RabbitNode

pytestmark = pytest.mark.chaos

BLOCKED_WINDOW_S = 1.0  # how long the test watches the blocked relay do nothing


async def test_memory_alarm__claims_nothing_and_counts_no_attempt_until_the_alarm_clears(
    db: str, rabbit_node: RabbitNode, tmp_path: Path
) -> None:
    name = f"relay-alarm-{secrets.token_hex(4)}"
    env = Env(pg_dsn=db, amqp_url=rabbit_node.url, exchange=f"{name}-x", queue=f"{name}-q")
    await declare_names(env)
    async with chaos_flow(env, tmp_path, "memory alarm", backlog=1) as flow:
        relay = flow.group.start()
        warm = flow.backlog
        await flow.consumer.wait_all(warm, timeout_s=30)
        await asyncio.to_thread(rabbit_node.set_memory_alarm, True)
        try:
            # A publish is what makes the broker send connection.blocked to a publishing
            # connection: the relay publishes the next row and gets blocked.
            held = fresh_ids(3)
            await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, held[:1])
            await wait_until(lambda: flow.group.events("broker_blocked"), timeout_s=30,
                             what="broker_blocked in the relay log")
            await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, held[1:])
            until = time.monotonic() + BLOCKED_WINDOW_S
            while time.monotonic() < until:
                assert set(flow.consumer.ids) == set(warm), "nothing delivered while blocked"
                assert await _attempts(env.pg_dsn) == [0, 0, 0], "not the rows' fault"
                # At most the row whose publish met the block stays claimed; no new claim.
                now = await flow.probe.held([relay.pid])
                assert now is None or now.rows <= 1, f"claims while blocked: {now}"
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(rabbit_node.set_memory_alarm, False)
        await flow.consumer.wait_all(warm + held, timeout_s=60, dsn=env.pg_dsn)
        await wait_until(lambda: flow.group.events("broker_unblocked"), what="broker_unblocked")
        assert len(flow.group.events("broker_blocked")) == 1
        assert relay.alive()
        assert await relay.stop() == 0


async def _attempts(dsn: str) -> list[int]:
    return [r[0] for r in await pg_fetch(
        dsn, "SELECT attempts FROM queue_message ORDER BY seq")]
