"""node_label: how a broker node is named in /metrics, /healthz and logs (no credentials)."""

from __future__ import annotations

import pytest

from relay.amqp.nodes import node_label


@pytest.mark.parametrize(("url", "label"), [
    ("amqp://u:secret@rabbit-1:5673/vh", "rabbit-1:5673"),
    ("amqp://u:secret@rabbit-1/vh", "rabbit-1:5672"),
    ("amqps://u:secret@rabbit-1/vh", "rabbit-1:5671"),
    ("amqp://u:secret@[::1]:5672/", "[::1]:5672"),
    ("amqp://", "localhost:5672"),
])
def test_node_label__host_and_port_never_the_credentials(url: str, label: str) -> None:
    assert node_label(url) == label
    assert "secret" not in node_label(url)
