"""RELAY_AMQP_URL as a comma-separated list of broker nodes: parse it, try them in turn."""

from __future__ import annotations

import random
from urllib.parse import unquote, urlsplit


def split_urls(value: str) -> list[str]:
    """The URLs of a comma-separated list (blank entries ignored)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def node_label(url: str) -> str:
    """host:port of a node URL (no user, no password): how logs, /healthz and /metrics name
    the node a relay is connected to."""
    parts = urlsplit(url)
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    host = parts.hostname or "localhost"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def broker_user(url: str) -> str:
    """The user a URL logs in as (RabbitMQ's default is guest)."""
    return unquote(urlsplit(url).username or "guest")


class Nodes:
    """A shuffled ring of node URLs: each replica starts at a random node, and moves on to the
    next one when a connection attempt fails or an established connection is lost."""

    def __init__(self, value: str, rng: random.Random | None = None) -> None:
        self.urls = split_urls(value)
        if not self.urls:
            raise ValueError("no broker URL given")
        (rng or random).shuffle(self.urls)
        self._at = 0

    @property
    def current(self) -> str:
        """The URL to connect to now."""
        return self.urls[self._at]

    def advance(self) -> str:
        """Move to the next node and return its URL."""
        self._at = (self._at + 1) % len(self.urls)
        return self.current
