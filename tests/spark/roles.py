"""A LOGIN user in a Spark writer role, as an operator makes one: `relay migrate --roles
--spark-role NAME`, then `CREATE ROLE <login> LOGIN IN ROLE <NAME>` (docs/spark.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from tests.helpers import RELAY_BIN


def as_user(dsn: str, user: str) -> str:
    """The same DSN with another user (the test server trusts local connections)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rsplit('@', 1)[-1]}"))


@contextlib.asynccontextmanager
async def spark_writer_login(dsn: str) -> AsyncIterator[str]:
    """DSN of a login in a fresh Spark writer role (names unique to the caller). Roles are
    cluster-wide: their grants and the roles are dropped at the end."""
    tag = secrets.token_hex(3)
    producer, relay, spark, login = (f"t_{n}_{tag}" for n in ("prod", "relay", "spark", "job"))
    admin = await asyncpg.connect(dsn)
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [RELAY_BIN, "migrate", "--roles", "--producer-role", producer, "--relay-role", relay,
             "--spark-role", spark],
            env={**os.environ, "RELAY_PG_DSN": dsn}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"{spark} (Spark jobs" in done.stdout, done.stdout
        await admin.execute(f"CREATE ROLE {login} LOGIN IN ROLE {spark}")
        yield as_user(dsn, login)
    finally:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            f"WHERE usename = '{login}'")
        for role in (login, spark, relay, producer):
            with contextlib.suppress(asyncpg.UndefinedObjectError):
                await admin.execute(f"DROP OWNED BY {role}")
                await admin.execute(f"DROP ROLE {role}")
        await admin.close()
