"""The tests' private RabbitMQ node survives what CI met: its AMQP port taken by another process
after it was picked, while the node boots."""

from __future__ import annotations

import socket

import aio_pika

from tests.servers.rabbitmq_node import RabbitNode


async def test_private_node__a_port_taken_while_it_boots_is_replaced_and_the_node_starts() -> None:
    node = RabbitNode()
    taken = node.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            node.start(timeout_s=60)
            assert node.port != taken
            conn = await aio_pika.connect(node.url, timeout=10)
            await conn.close()
        finally:
            node.destroy()
    assert not node.root.exists()
