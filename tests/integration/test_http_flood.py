"""The HTTP port cannot be flooded: a relay whose open-file limit is a container's usual 1,024
(the descriptors its database and broker connections need too) takes 2,000 idle connections to
its HTTP port; /healthz still answers within 2 s, its descriptors stay far from the limit, and
rows keep flowing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import RELAY_BIN, Env, wait_until
from tests.integration.test_http import http_get
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows

FILE_LIMIT = 1024
IDLE_CONNECTIONS = 2000


def _start_limited(env: Env, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """`relay run` under an open-file limit of FILE_LIMIT (prlimit execs it: same pid)."""
    with log_path.open("wb") as log:
        return subprocess.Popen(["prlimit", f"--nofile={FILE_LIMIT}", RELAY_BIN, "run"],
                                env=env.relay_env(http_port=port), stdout=log,
                                stderr=subprocess.STDOUT)


def _file_limit(pid: int) -> int:
    """The process's soft open-file limit."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open-file limit for process {pid}")


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _idle_connection(port: int) -> asyncio.StreamWriter | None:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    except (OSError, TimeoutError):
        return None
    return writer


@pytest.mark.timing
async def test_http__two_thousand_idle_connections_leave_healthz_answering_and_rows_flowing(
    env: Env, consumer: Consumer, tmp_path: Path,
) -> None:
    port = free_port()
    relay = _start_limited(env, port, tmp_path / "relay.log")
    writers: list[asyncio.StreamWriter] = []
    try:
        async def healthy() -> bool:
            return (await http_get(port, "/healthz"))[0] == 200

        await wait_until(healthy, timeout_s=60, what="/healthz answering before the flood")
        assert _file_limit(relay.pid) == FILE_LIMIT
        opened = await asyncio.gather(*(_idle_connection(port)
                                        for _ in range(IDLE_CONNECTIONS)))
        writers = [w for w in opened if w is not None]
        assert len(writers) >= IDLE_CONNECTIONS // 2, "the flood's connections were made"
        started = time.monotonic()
        status, body = await http_get(port, "/healthz")
        assert status == 200, body
        assert time.monotonic() - started < 2.0
        assert _descriptors(relay.pid) < FILE_LIMIT // 2
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                                [{"during": "flood"} for _ in range(20)])
        await consumer.wait_for(len(ids), timeout_s=30)
        assert relay.poll() is None
    finally:
        for writer in writers:
            writer.transport.abort()
        relay.terminate()
        assert relay.wait(timeout=30) == 0
