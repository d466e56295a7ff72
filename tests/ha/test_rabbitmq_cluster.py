"""RabbitMQ cluster: two relays given the address list of a private 3-node cluster publish into
a quorum queue; the node each relay is connected to is stopped in turn (one node down at a
time, so the queue keeps its majority). Nothing is lost; the relays' duplicates are counted,
printed and bounded by what was in flight at each stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from tests.chaos.harness import (
    RobustConsumer,
    assert_drained,
    fresh_ids,
    insert_with_ids,
    outbox_state,
    relays,
    report,
)
from tests.ha.rabbit_cluster import RabbitCluster, nodes_of
from tests.helpers import Env, RelayProcess, wait_until

pytestmark = [
    pytest.mark.ha,
    # Three Erlang VMs start, cluster and stop: more than the suite's default per-test bound on a
    # loaded machine (a run on 2 busy cores took 3.5 min; see docs/operations.md).
    pytest.mark.timeout(600),
    # Opt-in: it takes minutes, and on a 2-core machine under heavy load two runs did not end
    # (rows missing 300 s after the second node stop); the failure says where missing rows are.
    pytest.mark.skipif(
        os.environ.get("RELAY_TEST_HA_CLUSTER") != "1",
        reason="RabbitMQ cluster test: opt-in with RELAY_TEST_HA_CLUSTER=1 (several minutes; "
        "two runs under heavy load stalled after the second node stop, see docs/operations.md)",
    ),
]

# At least this many rows, produced at a steady pace over PRODUCE_S (and on, until both stops
# are done), so that rows flow while each node stops. CI runs the default; the 100,000 of the
# scenario run with RELAY_TEST_HA_ROWS=100000 (docs/operations.md quotes both).
ROWS = int(os.environ.get("RELAY_TEST_HA_ROWS", "30000"))
PRODUCE_S, CHUNK = 30.0, 1000
BATCH_SIZE, CONCURRENCY, RELAYS = 200, 2, 2


@pytest.fixture
def cluster() -> Iterator[RabbitCluster]:
    """A started 3-node cluster, destroyed (processes and folders) after the test."""
    nodes = RabbitCluster(3)
    try:
        yield nodes.start()
    finally:
        nodes.destroy()


async def _declare(url: str, exchange: str, queue: str) -> None:
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        x = await channel.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT, durable=True)
        q = await channel.declare_queue(queue, durable=True,
                                        arguments={"x-queue-type": "quorum"})
        await q.bind(x, "rk")
    finally:
        await conn.close()


async def _node_of(relay: RelayProcess, cluster: RabbitCluster) -> str:
    """The cluster node `relay` publishes through (waiting for its connection)."""
    found: set[str] = set()

    async def connected() -> bool:
        found.update(await asyncio.to_thread(nodes_of, cluster, relay.pid))
        return bool(found)

    await wait_until(connected, timeout_s=60, interval_s=0.5, what="the relay's broker connection")
    return sorted(found)[0]


async def _stop(nodename: str, cluster: RabbitCluster, consumers: list[RobustConsumer],
                procs: list[RelayProcess]) -> None:
    """Stop a node; return once rows flow again and no relay publishes through it; then start
    it again (one node down at a time: the quorum queue keeps its majority)."""
    node = cluster.node_named(nodename)
    await wait_until(lambda: asyncio.to_thread(cluster.quorum_safe_to_stop, node),
                     timeout_s=120, interval_s=1, what=f"{nodename} not quorum-critical")
    await asyncio.to_thread(cluster.stop_node, node)
    received = sum(len(c.ids) for c in consumers)
    await wait_until(lambda: sum(len(c.ids) for c in consumers) > received, timeout_s=60,
                     what=f"deliveries with {nodename} stopped")
    for relay in procs:
        assert nodename not in await _node_of(relay, cluster)
    await asyncio.to_thread(cluster.start_node, node)


async def _produce(dsn: str, exchange: str, ids: list[str], done: asyncio.Event) -> None:
    """Insert CHUNK rows at a steady pace until ROWS are in and `done` is set."""
    interval_s = PRODUCE_S * CHUNK / ROWS
    while len(ids) < ROWS or not done.is_set():
        chunk = fresh_ids(CHUNK)
        await insert_with_ids(dsn, exchange, "rk", chunk)
        ids.extend(chunk)
        await asyncio.sleep(interval_s)


async def test_rabbitmq_cluster__node_of_each_relay_stopped_loses_nothing(
    cluster: RabbitCluster, db: str, tmp_path: Path
) -> None:
    exchange, queue = "relay-ha-x", "relay-ha-q"
    await _declare(cluster.urls[0], exchange, queue)
    env = Env(pg_dsn=db, amqp_url=",".join(cluster.urls), exchange=exchange, queue=queue)
    consumers = []
    for url in cluster.urls:  # one per node: the others carry on while one node is down
        consumers.append(await RobustConsumer(url, queue).start())
    started = time.monotonic()
    producer: asyncio.Future[None] | None = None
    try:
        with relays(env, tmp_path, reconnect_max_s=1, batch_size=BATCH_SIZE,
                    concurrency=CONCURRENCY) as group:
            first, second = group.start(), group.start()
            ids: list[str] = []
            stops_done = asyncio.Event()
            producer = asyncio.ensure_future(_produce(db, exchange, ids, stops_done))
            await wait_until(lambda: sum(c.distinct() for c in consumers) > ROWS // 10,
                             timeout_s=120, what="flow before the first stop")
            first_node, second_node = await _node_of(first, cluster), await _node_of(second,
                                                                                       cluster)
            await _stop(first_node, cluster, consumers, group.procs)
            stopped = [first_node]
            if second_node != first_node:
                await _stop(second_node, cluster, consumers, group.procs)
                stopped.append(second_node)
            stops_done.set()
            await producer
            try:
                await wait_until(lambda: set(ids) <= {i for c in consumers for i in c.ids},
                                 timeout_s=300, interval_s=0.5, what="every row delivered")
            except AssertionError as exc:
                missing = sorted(set(ids) - {i for c in consumers for i in c.ids})
                where = await outbox_state(db, missing)
                raise AssertionError(f"{exc}: {len(missing)} missing; {where}") from None
            await assert_drained(db)
            merged = RobustConsumer(env.amqp_url, queue,
                                    ids=[i for c in consumers for i in c.ids],
                                    redelivered=[i for c in consumers for i in c.redelivered])
            outcome = report("rabbitmq cluster (node of each relay stopped)", ids, merged)
            bound = len(stopped) * RELAYS * CONCURRENCY * BATCH_SIZE
            print(f"[ha] stopped {stopped}; relay republished={outcome.republished} "
                  f"(bound {bound}), rows={len(ids)}, {time.monotonic() - started:.0f}s")
            assert (outcome.lost, outcome.unexpected) == (0, 0)
            assert outcome.republished <= bound
            assert all(p.alive() for p in group.procs)
            codes = await asyncio.gather(*(asyncio.to_thread(p.terminate, 20)
                                           for p in group.procs))
            assert codes == [0, 0]
    finally:
        if producer is not None:
            producer.cancel()
        for consumer in consumers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(consumer.stop(), timeout=10)
