"""The one asyncpg internal the relay touches: a connection's socket (for TCP options).

asyncpg has no option for client-side keepalives or TCP_USER_TIMEOUT; the socket is reached
through the connection's transport. pyproject.toml pins asyncpg to a tested range and
tests/integration/test_compat.py fails if this stops finding the socket.
"""

from __future__ import annotations

import socket
from typing import Any


def socket_of(conn: Any) -> socket.socket | None:
    """The connection's socket, or None when it cannot be found (a pooled proxy is unwrapped)."""
    raw = getattr(conn, "_con", None) or conn  # asyncpg's PoolConnectionProxy
    transport = getattr(raw, "_transport", None)
    if transport is None:
        return None
    sock = transport.get_extra_info("socket")
    return sock if hasattr(sock, "setsockopt") else None
