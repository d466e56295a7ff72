"""The one asyncpg internal the relay touches: a connection's socket (for TCP options).

asyncpg has no option for client-side keepalives or TCP_USER_TIMEOUT; the socket is reached
through the connection's transport. pyproject.toml pins asyncpg to a tested range and
tests/integration/test_compat.py fails if this stops finding the socket.
"""

from __future__ import annotations

import contextlib
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


def tune_socket(conn: Any, *, idle_s: int, interval_s: int, user_timeout_ms: int) -> None:
    """Client-side TCP keepalives and TCP_USER_TIMEOUT on a session's socket: a cut link is
    noticed by the kernel (keepalives unanswered on a session waiting for a reply, data sent
    and never acknowledged on a busy one) instead of a statement waiting for ever or out its
    timeout. The server's tcp_keepalives_* settings only cover the server's side; asyncpg has
    no option for this."""
    sock = socket_of(conn)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a unix socket has no network to lose
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", interval_s),
                            ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", user_timeout_ms)):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
