"""PostgreSQL restarts mid-flow (a private cluster, never the shared one): nothing is lost,
no row stays locked, each outage is logged once."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import (
    RobustConsumer,
    assert_drained,
    fresh_ids,
    insert_with_ids,
    relays,
    report,
)
from tests.chaos.pgcluster import PrivateCluster
from tests.helpers import RELAY_BIN, Env, wait_until

pytestmark = pytest.mark.chaos


@pytest.fixture
def private_pg() -> Iterator[PrivateCluster]:
    """A started private cluster, destroyed after the test."""
    cluster = PrivateCluster().init()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


async def test_postgres_restart__mid_flow_loses_nothing_and_leaves_nothing_locked(
    private_pg: PrivateCluster, amqp_url: str, broker_names: tuple[str, str], tmp_path: Path
) -> None:
    env = Env(pg_dsn=private_pg.dsn, amqp_url=amqp_url, exchange=broker_names[0],
              queue=broker_names[1])
    await asyncio.to_thread(subprocess.run, [RELAY_BIN, "migrate"], env=env.relay_env(),
                            check=True, capture_output=True, timeout=60)
    ids = fresh_ids(15_000)
    for start in range(0, len(ids), 5000):
        await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, ids[start:start + 5000])
    consumer = await RobustConsumer(env.amqp_url, env.queue).start()
    try:
        with relays(env, tmp_path, reconnect_max_s=2, batch_size=200) as group:
            relay = group.start()
            await wait_until(lambda: consumer.distinct() > 2000, what="flow before the fault")
            private_pg.stop("fast")
            await asyncio.sleep(3.0)
            private_pg.start()
            await consumer.wait_all(ids, timeout_s=90, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn)
            lost, _duplicates = report("postgres restart", ids, consumer)
            assert lost == 0
            assert relay.alive()
            # The pool's Supervisor logs the outage once (the LISTEN session logs its own).
            pool = [e for e in group.events("connection_lost") if e["connection"] == "database"]
            back = [e for e in group.events("connection_restored")
                    if e["connection"] == "database"]
            assert (len(pool), len(back)) == (1, 1)
            assert relay.terminate() == 0
    finally:
        await consumer.stop()
