"""Where a benchmark's PostgreSQL runs: a private cluster with the server's defaults.

The shared server of this machine runs with `autovacuum = off` (a setting of the machine's
image, not of users' servers), so a backlog or churn figure taken there measures a server no
user runs. `python -m bench` starts a cluster of its own
with `initdb` and every default (fsync, autovacuum, shared_buffers...), on a free port, and
remove it afterwards; a cluster an earlier, killed run left behind is removed at the start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import uvloop

from bench import common
from tests.chaos.pgcluster import PrivateCluster, remove_stale

T = TypeVar("T")

PREFIX = "relay-bench-pg-"


@contextmanager
def private_server() -> Iterator[str]:
    """A running private cluster for this run; yields its admin DSN."""
    for stale in remove_stale(PREFIX):
        print(f"removed a cluster an earlier run left: {stale}", flush=True)
    cluster = PrivateCluster(prefix=PREFIX, durable=True, max_connections=100).init()
    try:
        cluster.start()
        yield cluster.dsn
    finally:
        cluster.destroy()


def run_on_private_server(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run `scenario()` with every benchmark database on a private cluster of its own."""
    with private_server() as dsn:
        common.use_server(dsn)
        return uvloop.run(scenario())  # type: ignore[arg-type]
