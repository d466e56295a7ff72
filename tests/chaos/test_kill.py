"""kill -9 of relay replicas while rows flow: nothing is lost, no row stays locked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.chaos.harness import RobustConsumer, assert_drained, produce, relays, report
from tests.helpers import Env, wait_until

pytestmark = pytest.mark.chaos


async def test_kill9__one_of_two_replicas_every_second_loses_nothing(
    env: Env, tmp_path: Path
) -> None:
    consumer = await RobustConsumer(env.amqp_url, env.queue).start()
    try:
        with relays(env, tmp_path) as group:
            replicas = [group.start(), group.start()]
            producer = asyncio.ensure_future(produce(env, 30_000, chunk=300, interval_s=0.15))
            kills = 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                victim = kills % 2
                replicas[victim].kill()
                replicas[victim] = group.start()
                kills += 1
            ids = await producer
            await consumer.wait_all(ids, timeout_s=90, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn)
            lost, _duplicates = report(f"kill -9 x{kills}", ids, consumer)
            assert lost == 0
            assert kills >= 15
            assert all(p.alive() for p in replicas)
            # A process still importing has no SIGTERM handler yet: let it finish starting.
            for p in replicas:
                await wait_until(lambda p=p: '"relay_started"' in p.log_text(), what="start")
            assert [p.terminate() for p in replicas] == [0, 0]
    finally:
        await consumer.stop()
