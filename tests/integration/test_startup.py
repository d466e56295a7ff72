"""Start in any order: `relay run` and `relay migrate` wait for servers that are not up yet (a
port where nothing listens, then a TCP proxy to the real server appears on it), up to
RELAY_STARTUP_TIMEOUT_S; past it they exit 75, distinct from a bad setting (2)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.helpers import RELAY_BIN, Env, RelayProcess, pg_fetchval, wait_until
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows
from tests.kit.proxy import TcpProxy

EXIT_GAVE_UP = 75
EXIT_USER_ERROR = 2


def _via(url: str, port: int) -> str:
    """The same URL through 127.0.0.1:<port>."""
    parts = urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


async def _proxy_on(url: str, port: int) -> TcpProxy:
    """Start forwarding 127.0.0.1:<port> to the server of `url`."""
    parts = urlsplit(url)
    return await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0, port=port).start()


def _waiting(proc: RelayProcess, connection: str) -> list[dict[str, Any]]:
    return [e for e in proc.log_events()
            if e.get("event") == "connection_waiting" and e.get("connection") == connection]


def _healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


async def test_run__waits_for_database_and_broker_that_come_up_later_then_delivers(
    env: Env, consumer: Consumer, relays: list[RelayProcess], tmp_path: Path
) -> None:
    pg_port, mq_port, http_port = free_port(), free_port(), free_port()
    relay = RelayProcess(
        env.relay_env(pg_dsn=_via(env.pg_dsn, pg_port), amqp_url=_via(env.amqp_url, mq_port),
                      startup_timeout_s=120, reconnect_max_s=0.5, http_port=http_port),
        tmp_path / "relay.log",
    ).start()
    relays.append(relay)
    proxies: list[TcpProxy] = []
    try:
        await wait_until(lambda: _waiting(relay, "database"), what="connection_waiting (database)")
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(20))
        proxies.append(await _proxy_on(env.pg_dsn, pg_port))
        await wait_until(lambda: _waiting(relay, "broker"), timeout_s=60,
                         what="connection_waiting (broker)")
        assert relay.alive()
        proxies.append(await _proxy_on(env.amqp_url, mq_port))
        await consumer.wait_for(len(ids), timeout_s=60)
        assert set(consumer.ids) == set(ids)
        # One line per server however many attempts failed, one when each came up.
        assert len(_waiting(relay, "database")) == 1
        assert len(_waiting(relay, "broker")) == 1
        restored = {e["connection"] for e in relay.log_events()
                    if e.get("event") == "connection_restored"}
        assert {"database", "broker"} <= restored
        health = await asyncio.to_thread(_healthz, http_port)
        assert health["connections"]["database"]["state"] == "up"
        await wait_until(lambda: _healthz(http_port)["connections"]["listener"]["state"] == "up",
                         what="the LISTEN session up in /healthz")
        # The proxies run on this event loop: wait for the exit without blocking it.
        assert await asyncio.to_thread(relay.terminate, 20) == 0
    finally:
        for proxy in proxies:
            await proxy.close()


@pytest.mark.parametrize("missing", ["database", "broker"])
async def test_run__gives_up_after_the_startup_timeout_with_its_own_exit_code(
    env: Env, missing: str
) -> None:
    dead = free_port()
    overrides: dict[str, object] = {"startup_timeout_s": 1, "reconnect_max_s": 0.2}
    if missing == "database":
        overrides["pg_dsn"] = _via(env.pg_dsn, dead)
    else:
        overrides["amqp_url"] = _via(env.amqp_url, dead)
    started = time.monotonic()
    proc = await asyncio.to_thread(
        subprocess.run, [RELAY_BIN, "run"], env=env.relay_env(**overrides),
        capture_output=True, text=True, timeout=60,
    )
    elapsed_s = time.monotonic() - started
    assert proc.returncode == EXIT_GAVE_UP, proc.stderr
    # The last line is a relay_failed event (JSON off a terminal), like every stderr line.
    assert f'"error": "gave up waiting: {missing}:' in proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed_s >= 1


async def test_run__a_missing_database_is_a_bad_setting_not_waited_for(env: Env) -> None:
    parts = urlsplit(env.pg_dsn)
    missing_db = urlunsplit(parts._replace(path="/relay_no_such_database"))
    # Were it waited for, the 600 s bound would outlast the 120 s the test gives it.
    proc = await asyncio.to_thread(
        subprocess.run, [RELAY_BIN, "run"],
        env=env.relay_env(pg_dsn=missing_db, startup_timeout_s=600),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr
    assert "relay_no_such_database" in proc.stderr


async def test_migrate__waits_for_a_database_that_comes_up_later(
    empty_db: str, amqp_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = Env(pg_dsn=_via(empty_db, port), amqp_url=amqp_url, exchange="", queue="")
    migrate = RelayProcess(env.relay_env(startup_timeout_s=120, reconnect_max_s=0.5),
                           tmp_path / "migrate.log", command="migrate").start()
    proxy: TcpProxy | None = None
    try:
        await wait_until(lambda: _waiting(migrate, "migrate"), what="connection_waiting (migrate)")
        proxy = await _proxy_on(empty_db, port)
        assert migrate.proc is not None
        assert await asyncio.to_thread(migrate.proc.wait, 60) == 0, migrate.log_text()
    finally:
        migrate.kill()
        if proxy is not None:
            await proxy.close()
    assert await pg_fetchval(empty_db, "SELECT to_regclass('queue_message') IS NOT NULL")


async def test_run__sigterm_while_waiting_for_a_server_exits_0(
    env: Env, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = RelayProcess(
        env.relay_env(pg_dsn=_via(env.pg_dsn, free_port()), startup_timeout_s=600),
        tmp_path / "relay.log",
    ).start()
    relays.append(relay)
    await wait_until(lambda: _waiting(relay, "database"), what="connection_waiting (database)")
    assert await asyncio.to_thread(relay.terminate, 10) == 0
    assert any(e.get("event") == "relay_stopped" for e in relay.log_events())


async def test_run__sigusr1_logs_where_every_task_waits_and_keeps_running(
    env: Env, consumer: Consumer, relays: list[RelayProcess], tmp_path: Path
) -> None:
    relay = RelayProcess(env.relay_env(), tmp_path / "relay.log").start()
    relays.append(relay)
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(5))
    await consumer.wait_for(len(ids), timeout_s=60)
    os.kill(relay.pid, signal.SIGUSR1)

    def dumps() -> list[dict[str, Any]]:
        return [e for e in relay.log_events() if e.get("event") == "tasks_waiting"]

    await wait_until(lambda: bool(dumps()), what="the tasks_waiting line after SIGUSR1")
    chains = [" <- ".join(t["awaits"]) for t in dumps()[0]["tasks"]]
    # The worker's loop is among them, wherever it waits (asleep, or in a sweep's claim), and
    # a chain runs from the outermost call to the innermost.
    worker = [c for c in chains if "worker.py" in c and "_worker_main" in c]
    assert worker, chains
    assert worker[0].index("_worker_main") < worker[0].index("worker.py")
    assert relay.alive()
    more = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(5))
    await consumer.wait_for(len(ids) + len(more), timeout_s=60)
    assert await asyncio.to_thread(relay.terminate, 20) == 0
