"""Which broker node a relay is on, in view: with RELAY_AMQP_URL a list of two nodes (two TCP
proxies in front of the local RabbitMQ), /metrics, /healthz and the status page name the node
the connection is on and count failovers; cutting that node moves the relay to the other one.
`relay tail` takes the same list. Real `relay run`, PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import json
import subprocess

import aio_pika

from tests.helpers import RELAY_BIN, Env, wait_until
from tests.integration.test_http import http_get, probe, samples, via
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows
from tests.kit.proxy import TcpProxy


async def _node_metrics(port: int) -> tuple[set[str], float | None]:
    """The nodes relay_broker_node reports 1 for, and relay_broker_failovers_total."""
    status, text = await http_get(port, "/metrics")
    if status != 200:
        return set(), None
    found = samples(text)
    nodes = {dict(labels)["node"] for (name, labels), value in found.items()
             if name == "relay_broker_node" and value == 1}
    return nodes, found.get(("relay_broker_failovers_total", ()))


async def test_broker_node__shown_in_metrics_healthz_and_status_page_and_failover_counted(
    env: Env, consumer: Consumer, start_relay
) -> None:
    host, port = "127.0.0.1", 5672
    proxies = {}
    for _ in range(2):
        proxy = await TcpProxy(host, port).start()
        proxies[f"127.0.0.1:{proxy.port}"] = proxy
    try:
        http_port = free_port()
        relay = start_relay(
            amqp_url=",".join(via(env.amqp_url, p) for p in proxies.values()),
            http_port=http_port, reconnect_max_s=0.5)

        async def on_one_node() -> bool:
            nodes, _ = await _node_metrics(http_port)
            return len(nodes) == 1

        await wait_until(on_one_node, timeout_s=30, what="relay_broker_node for one node")
        (first,), failovers = await _node_metrics(http_port)
        assert first in proxies
        assert failovers == 0
        _, health = await probe(http_port, "/healthz")
        broker = health["connections"]["broker"]
        assert (broker["node"], broker["failovers"]) == (first, 0), broker
        _, page = await http_get(http_port, "/status")
        assert "This relay&#x27;s broker node" in page
        assert f"{first} · 0 failovers" in page

        await proxies[first].cut()  # that node is gone; the other one answers
        (other,) = set(proxies) - {first}

        async def moved() -> bool:
            nodes, count = await _node_metrics(http_port)
            return nodes == {other} and count == 1

        await wait_until(moved, timeout_s=30, what=f"the relay on {other} after 1 failover")
        _, health = await probe(http_port, "/healthz")
        assert health["connections"]["broker"]["node"] == other
        assert [e["node"] for e in relay.log_events() if e.get("event") == "broker_failover"] \
            == [other]
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [1, 2])
        await consumer.wait_for(2, timeout_s=15)
        assert set(consumer.ids) == set(ids)
        assert relay.alive()
    finally:
        for proxy in proxies.values():
            await proxy.close()


async def test_tail__takes_a_node_list_and_uses_the_first_node_that_answers(env: Env) -> None:
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    proc = await asyncio.create_subprocess_exec(
        RELAY_BIN, "tail", env.exchange, env.routing_key, "--count", "1",
        env={**env.relay_env(amqp_url=f"{dead},{env.amqp_url}")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        # Published only once tail is bound, or the message would go nowhere.
        seen: list[bytes] = []
        while not seen or b"tailing exchange" not in seen[-1]:
            line = await asyncio.wait_for(proc.stderr.readline(), timeout=30)
            assert line, f"tail ended before binding: {b''.join(seen)!r}"
            seen.append(line)
        conn = await aio_pika.connect(env.amqp_url)
        try:
            channel = await conn.channel()
            exchange = await channel.get_exchange(env.exchange)
            await exchange.publish(aio_pika.Message(b'{"tail": 1}', message_id="m-1"),
                                   routing_key=env.routing_key)
        finally:
            await conn.close()
        out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[0])["routing_key"] == env.routing_key
