"""The one source of free TCP ports for the servers, proxies and relays the tests start.

A port asked of the kernel with bind(0) comes from its ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), the range every outgoing connection's local port is
taken from too. Between the moment such a port is handed out and the moment the server given it
binds it (a RabbitMQ node boots for seconds), a client's connection elsewhere can take it, and
the server then fails to start with `eaddrinuse` while a check that "something listens there"
passes. So the ports handed out here are below that range, are checked free, and are never
handed out twice in one test run. Where the suite runs on several workers (pytest-xdist,
tests/run.py), each worker takes the ports of its own residue modulo their number, so two
workers never hand out the same port.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

# Ports below LOWEST are for the machine's own services (PostgreSQL 5432, RabbitMQ 5672...).
LOWEST = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def _share() -> tuple[int, int]:
    """(this worker's number, how many workers): (0, 1) outside pytest-xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def _highest() -> int:
    """The port below the kernel's ephemeral range (32767 by Linux's default range)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        return 32767


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the kernel's
    ephemeral range, not handed out before in this process."""
    highest = _highest()
    if highest - LOWEST < 1000:
        raise RuntimeError(f"the ephemeral range ({EPHEMERAL_RANGE}) leaves no ports between "
                           f"{LOWEST} and it for test servers")
    mine, workers = _share()
    for _ in range(1000):
        port = random.randint(LOWEST, highest)
        port -= (port - mine) % workers
        if port < LOWEST or port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port found between {LOWEST} and {highest} in 1000 tries")
