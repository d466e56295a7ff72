"""RabbitMQ cluster: two relays given the address list of a private 3-node cluster publish into
a quorum queue; the node each relay is connected to is stopped in turn (one node down at a
time, so the queue keeps its majority). Nothing is lost; the relays' duplicates are counted,
printed and bounded by what was in flight at each stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from tests.chaos.harness import assert_drained, relays, report
from tests.ha.rabbit_cluster import RabbitCluster, nodes_of, remove_strays
from tests.helpers import Env, RelayProcess, pg_fetchval, wait_until
from tests.kit.consumer import Consumer, outbox_state
from tests.kit.ports import free_port
from tests.kit.producer import fresh_ids, insert_with_ids

pytestmark = [
    pytest.mark.ha,
    # Three Erlang VMs start, cluster and stop, once for the module; a test's two node stops
    # take about a minute on a quiet 2-core machine; the bound leaves room for a loaded one.
    pytest.mark.timeout(600),
]

# At least this many rows, produced at a steady pace over PRODUCE_S (and on, until both stops
# are done), so that rows flow while each node stops.
ROWS = int(os.environ.get("RELAY_TEST_HA_ROWS", "30000"))
PRODUCE_S, CHUNK = 30.0, 1000
BATCH_SIZE, CONCURRENCY, RELAYS = 200, 2, 2
# Seconds without a new delivery (while rows are missing) that count as a stall.
STALL_S = 60.0


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[RabbitCluster]:
    """One started 3-node cluster for the module's tests (three Erlang VMs take about 20 s to
    start and join), destroyed (processes and folders) after them; nodes an earlier, killed run
    left behind are removed first. A cluster that fails to form is thrown away and started once
    more; the first failure is reported as a warning, so that a run says what went wrong."""
    strays = remove_strays()
    if strays:
        print(f"[ha] removed stray nodes of an earlier run: {strays}")
    nodes = RabbitCluster(3)
    try:
        nodes.start()
    except (RuntimeError, subprocess.TimeoutExpired) as first:
        nodes.destroy()
        warnings.warn(f"a private RabbitMQ cluster failed to form, started again: {first}",
                      stacklevel=1)
        nodes = RabbitCluster(3)
        nodes.start()
    try:
        yield nodes
    finally:
        nodes.destroy()


@pytest.fixture
def cluster(shared_cluster: RabbitCluster) -> RabbitCluster:
    """The module's cluster with every node's application running (a test that failed half
    way may have left nodes stopped); each test declares its own exchanges and queues."""
    for node in list(shared_cluster.nodes):
        if node.nodename in shared_cluster.stopped:
            shared_cluster.start_node(node)
    return shared_cluster


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


def _healthz(relay: RelayProcess) -> str:
    """The relay's /healthz body (each supervised connection's state, the broker node it is
    on, its failovers), or why it could not be read."""
    port = relay.env.get("RELAY_HTTP_PORT")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
            return str(reply.read().decode())
    except OSError as exc:  # an HTTP error status is an OSError too, with a body worth reading
        body = exc.read().decode() if isinstance(exc, urllib.error.HTTPError) else ""
        return f"unreadable ({exc}) {body}"


async def _state(cluster: RabbitCluster, procs: list[RelayProcess], queue: str) -> str:
    """What a stall looks like from outside: which node each relay's connections are on, each
    relay's /healthz, and the quorum queue's members with their raft state."""
    lines = []
    for i, relay in enumerate(procs):
        nodes = (await asyncio.to_thread(nodes_of, cluster, relay.pid)) if relay.alive() else {}
        lines.append(f"relay {i} (pid {relay.pid}, alive {relay.alive()}): connections on "
                     f"{sorted(nodes)}; /healthz {await asyncio.to_thread(_healthz, relay)}")
    lines.append(f"stopped nodes: {sorted(cluster.stopped)}")
    lines.append("queue (name, messages, ready, unacked, consumers): "
                 f"{await asyncio.to_thread(cluster.queue_depth, queue)}")
    lines.append(f"quorum_status {queue}:\n{await asyncio.to_thread(cluster.quorum_status, queue)}")
    return "\n".join(lines)


async def _all_delivered(ids: list[str], consumers: list[Consumer]) -> None:
    """Wait until every row arrived, as long as deliveries keep coming: on a loaded machine
    the consumers may trail the relays by tens of thousands of messages (the queue holds them),
    which is slow, not stuck. Fails after STALL_S without a new delivery."""
    received, last_progress = -1, time.monotonic()
    while not set(ids) <= {i for c in consumers for i in c.ids}:
        now_received = sum(len(c.ids) for c in consumers)
        if now_received != received:
            received, last_progress = now_received, time.monotonic()
        elif time.monotonic() - last_progress > STALL_S:
            raise AssertionError(f"no delivery for {STALL_S:.0f}s while waiting for every row "
                                 f"({received} receipts so far)")
        await asyncio.sleep(0.5)


async def _stop(nodename: str, cluster: RabbitCluster, consumers: list[Consumer],
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
    cluster: RabbitCluster, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over a minute (65 s quiet, 150-210 s in loaded CI runs): each of the two relays' nodes is
    stopped and started again in turn, and a node of the private cluster takes 10-30 s to stop,
    restart and rejoin; the rows flow through both stops."""
    exchange, queue = "relay-ha-x", "relay-ha-q"
    await _declare(cluster.urls[0], exchange, queue)
    env = Env(pg_dsn=db, amqp_url=",".join(cluster.urls), exchange=exchange, queue=queue)
    consumers = []
    for url in cluster.urls:  # one per node: the others carry on while one node is down
        consumers.append(await Consumer(url, queue, robust=True, manual_ack=True).start())
    started = time.monotonic()
    producer: asyncio.Future[None] | None = None
    try:
        with relays(env, tmp_path, reconnect_max_s=1, batch_size=BATCH_SIZE,
                    concurrency=CONCURRENCY) as group:
            first = group.start(http_port=free_port())
            second = group.start(http_port=free_port())
            ids: list[str] = []
            stops_done = asyncio.Event()
            producer = asyncio.ensure_future(_produce(db, exchange, ids, stops_done))
            stopped: list[str] = []
            try:
                await wait_until(lambda: sum(c.distinct() for c in consumers) > ROWS // 10,
                                 timeout_s=120, what="flow before the first stop")
                first_node = await _node_of(first, cluster)
                await _stop(first_node, cluster, consumers, group.procs)
                stopped.append(first_node)
                # Read after the first stop: both relays may have been on that node, and have
                # moved since. Two different nodes stop, one at a time.
                second_node = await _node_of(second, cluster)
                if second_node == first_node:
                    second_node = await _node_of(first, cluster)
                assert second_node != first_node, "no relay left the first stopped node"
                await _stop(second_node, cluster, consumers, group.procs)
                stopped.append(second_node)
                stops_done.set()
                await producer
                await _all_delivered(ids, consumers)
            except AssertionError as exc:
                missing = sorted(set(ids) - {i for c in consumers for i in c.ids})
                where = await outbox_state(db, missing)
                state = await _state(cluster, group.procs, queue)
                raise AssertionError(f"{exc} (nodes stopped so far: {stopped}): "
                                     f"{len(missing)} rows missing; {where}\n{state}") from None
            await assert_drained(db)
            merged = Consumer(env.amqp_url, queue,
                                    ids=[i for c in consumers for i in c.ids],
                                    redelivered=[i for c in consumers for i in c.redelivered])
            outcome = report("rabbitmq cluster (node of each relay stopped)", ids, merged)
            bound = len(stopped) * RELAYS * CONCURRENCY * BATCH_SIZE
            with capsys.disabled():  # in the suite's output, passed or not
                print(f"\n[ha] rabbitmq cluster: stopped {stopped}; lost={outcome.lost}, "
                      f"relay republished={outcome.republished} (bound {bound}), "
                      f"rows={len(ids)}, {time.monotonic() - started:.0f}s")
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


async def test_rabbitmq_cluster__a_quorum_queue_without_its_majority_holds_back_only_its_rows(
    cluster: RabbitCluster, db: str, tmp_path: Path
) -> None:
    """Two of three nodes stop: a quorum queue loses its majority and its confirms stop
    coming, while a classic queue on the node the relay is on flows. The quorum queue's rows
    sat at the head of every batch: every batch waited its whole budget, a pass that confirmed
    nothing dropped the broker connection, and each retry handed the broker another copy. Now
    its destination is left alone (rows postponed, no attempt counted) and tried again now and
    then; the classic queue's rows flow, and once the majority is back every quorum row
    arrives."""
    url = cluster.urls[0]
    exchange, quorum, classic = "relay-silent-x", "relay-silent-quorum", "relay-silent-classic"
    await _declare(url, exchange, quorum)  # the quorum queue, bound with "rk"
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        c = await channel.declare_queue(classic, durable=True)
        await c.bind(exchange, "classic")
    finally:
        await conn.close()
    for node in cluster.nodes[1:]:
        await asyncio.to_thread(cluster.stop_node, node)
    quorum_ids, classic_ids = fresh_ids(300), fresh_ids(3000)
    await insert_with_ids(db, exchange, "rk", quorum_ids)  # the oldest rows: batch heads
    await insert_with_ids(db, exchange, "classic", classic_ids)
    env = Env(pg_dsn=db, amqp_url=url, exchange=exchange, queue=classic)
    classic_consumer = await Consumer(url, classic, robust=True, manual_ack=True).start()
    quorum_consumer: Consumer | None = None
    try:
        with relays(env, tmp_path, publish_timeout_s=3, batch_size=100) as group:
            relay = group.start()
            started = time.monotonic()
            await wait_until(lambda: set(classic_ids) <= set(classic_consumer.ids),
                             timeout_s=60, interval_s=0.2,
                             what="every classic row while the quorum queue has no majority")
            took = time.monotonic() - started
            attempts = await pg_fetchval(
                db, "SELECT max(attempts) FROM queue_message WHERE routing_key = 'rk'")
            silent = await pg_fetchval(
                db, "SELECT count(*) FROM queue_message WHERE routing_key = 'rk' "
                "AND last_error LIKE 'destination_silent%'")
            drops = len(group.events("connection_lost", connection="broker"))
            print(f"\n[ha] quorum queue without majority: 3,000 classic rows in {took:.1f} s; "
                  f"quorum rows: max attempts {attempts}, {silent} postponed as silent; "
                  f"broker connection dropped {drops} times")
            assert attempts == 0, "a silent destination's rows are charged no attempt"
            assert silent > 0
            assert drops == 0, "the broker answered: its connection is not dropped"
            assert "destination_silent" in relay.log_text()
            for node in cluster.nodes[1:]:
                await asyncio.to_thread(cluster.start_node, node)
            quorum_consumer = await Consumer(url, quorum, robust=True, manual_ack=True).start()
            await wait_until(lambda: set(quorum_ids) <= set(quorum_consumer.ids),
                             timeout_s=180, interval_s=0.5,
                             what="every quorum row once the majority is back")
            await assert_drained(db)
    finally:
        await classic_consumer.stop()
        if quorum_consumer is not None:
            await quorum_consumer.stop()
