"""Finds the real PostgreSQL and RabbitMQ the tests use (see "Services in tests" in DESIGN.md).

Order: RELAY_TEST_PG_DSN / RELAY_TEST_AMQP_URL; else the local servers on their standard ports;
else testcontainers where a Docker engine answers. If none answers, the tests fail with a
message that says how to start a server: they never skip silently.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import aio_pika
import asyncpg

LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672/"

HOW_TO_START = (
    "No {what} answered. Set {env}, or start the local server "
    "({cmd}), or run a Docker engine for testcontainers."
)

_containers: list[Any] = []


async def _pg_answers(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except Exception:
        return False
    await conn.close()
    return True


async def _amqp_answers(url: str) -> bool:
    try:
        conn = await asyncio.wait_for(aio_pika.connect(url), timeout=5)
    except Exception:
        return False
    await conn.close()
    return True


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return False
    return True


def _find(env: str, local: str, probe: Callable[[str], Any], container: Callable[[], str],
          *, what: str, cmd: str) -> str:
    explicit = os.environ.get(env)
    if explicit:
        if not asyncio.run(probe(explicit)):
            raise RuntimeError(f"{env}={explicit} does not answer")
        return explicit
    if asyncio.run(probe(local)):
        return local
    if _docker_answers():
        return container()
    raise RuntimeError(HOW_TO_START.format(what=what, env=env, cmd=cmd))


def _pg_container() -> str:
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]

    c = PostgresContainer("postgres:15", username="postgres", password="postgres")
    c.start()
    _containers.append(c)
    host, port = c.get_container_host_ip(), c.get_exposed_port(5432)
    return f"postgresql://postgres:postgres@{host}:{port}/postgres"


def _amqp_container() -> str:
    from testcontainers.rabbitmq import RabbitMqContainer  # type: ignore[import-untyped]

    c = RabbitMqContainer("rabbitmq:3.13")
    c.start()
    _containers.append(c)
    host, port = c.get_container_host_ip(), c.get_exposed_port(5672)
    return f"amqp://guest:guest@{host}:{port}/"


def find_postgres() -> str:
    """An admin DSN of a PostgreSQL server that may create databases."""
    return _find("RELAY_TEST_PG_DSN", LOCAL_PG, _pg_answers, _pg_container, what="PostgreSQL",
                 cmd="pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")


def find_rabbitmq() -> str:
    """A RabbitMQ URL."""
    return _find("RELAY_TEST_AMQP_URL", LOCAL_AMQP, _amqp_answers, _amqp_container, what="RabbitMQ",
                 cmd="rabbitmq-server -detached")


def stop_containers() -> None:
    """Stop what testcontainers started."""
    while _containers:
        _containers.pop().stop()
