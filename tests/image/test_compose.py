"""docker-compose.yml run for real, as far as this machine allows: the demo's own PostgreSQL and
RabbitMQ images cannot be pulled here, so deploy/compose/host-servers.override.yml points the
demo's services at the machine's servers, and everything else runs as written: `migrate
--roles` as the owner, the relay as its least-privilege login with its DSN from a secret file,
the consumer, the Spark job as the Spark writer's login, each started when what it depends on
is healthy or done. The tool is Debian's docker-compose 1.29 (Compose v2 cannot be installed
here), which does not know the top-level `name` and refuses published ports beside the host's
network: it reads a copy of the file without both. The override runs one relay (two on the
host's network would want the same HTTP port). Run by .ci/image.sh."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import aio_pika
import yaml

from tests.helpers import count_rows, pg_session, wait_until, with_user
from tests.image.test_image import _image, docker
from tests.kit.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DEMO_EXCHANGE, DEMO_QUEUE = "demo.events", "demo.printer"  # deploy/compose/consumer.py
DEMO_ROWS = 1000  # the spark-job service's --rows


def _logins_sql() -> list[str]:
    """deploy/compose/initdb.sql's statements, each run only when its role is missing (the
    machine's server is shared: the roles may exist from an earlier run)."""
    text = (ROOT / "deploy/compose/initdb.sql").read_text()
    statements = [s.strip() for s in re.sub(r"--[^\n]*", "", text).split(";") if s.strip()]
    out = []
    for statement in statements:
        role = re.match(r"CREATE ROLE (\w+)", statement)
        assert role, statement
        out.append(f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = "
                   f"'{role.group(1)}') THEN {statement}; END IF; END $$")
    return out


def _for_compose_v1(path: Path) -> dict[str, Any]:
    """The demo's compose file as docker-compose 1.29 takes it beside the host-network
    override: without the top-level `name` (v1 does not know it) and without published ports
    (meaningless on the host's network, and v1 refuses both together)."""
    spec = yaml.safe_load(path.read_text())
    spec.pop("name", None)
    for service in spec["services"].values():
        service.pop("ports", None)
    return dict(spec)


async def _drop_demo_queue(amqp_url: str) -> None:
    conn = await aio_pika.connect(amqp_url)
    try:
        channel = await conn.channel()
        await channel.queue_delete(DEMO_QUEUE)
        await channel.exchange_delete(DEMO_EXCHANGE)
    finally:
        await conn.close()


def _compose(project: str, files: list[Path], env: dict[str, str], *args: str,
             timeout_s: float = 300) -> str:
    command = ["docker-compose", "--project-directory", str(ROOT), "-p", project]
    for f in files:
        command += ["-f", str(f)]
    done = subprocess.run([*command, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"docker-compose {' '.join(args)}: {done.stderr[-3000:]}"
    return done.stdout + done.stderr


def _container(project: str, service: str) -> str:
    return docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}",
                  "--filter", f"label=com.docker.compose.service={service}")


def _inspect(container: str, template: str) -> str:
    return docker("inspect", "-f", template, container)


async def test_compose_demo__services_run_as_written_against_the_hosts_servers(
    empty_db: str, amqp_url: str, tmp_path: Path
) -> None:
    docker("tag", _image("RELAY_TEST_IMAGE"), "outbox-relay:demo")
    docker("tag", _image("RELAY_TEST_SPARK_IMAGE"), "outbox-relay-spark:demo")
    async with pg_session(empty_db) as admin:
        for statement in _logins_sql():
            await admin.execute(statement)
    await _drop_demo_queue(amqp_url)
    v1_file = tmp_path / "docker-compose.yml"
    v1_file.write_text(yaml.safe_dump(_for_compose_v1(ROOT / "docker-compose.yml")))
    dsn_file = tmp_path / "relay_pg_dsn"
    dsn_file.write_text(with_user(empty_db, "relay"))
    env = {"DEMO_PG": empty_db, "DEMO_AMQP": amqp_url, "DEMO_RELAY_PG_FILE": str(dsn_file),
           "DEMO_SPARK_PG": with_user(empty_db, "spark_job"),
           "DEMO_HTTP_PORT": str(free_port())}
    files = [v1_file, ROOT / "deploy/compose/host-servers.override.yml"]
    project = f"relayci{secrets.token_hex(3)}"

    def compose(*args: str, timeout_s: float = 300) -> str:
        return _compose(project, files, env, *args, timeout_s=timeout_s)

    try:
        await asyncio.to_thread(compose, "up", "-d", "spark-job", timeout_s=600)

        async def consumer_printed_all() -> bool:
            logs = await asyncio.to_thread(
                compose, "logs", "--no-color", "--tail", "5", "consumer", timeout_s=60)
            return f"#{DEMO_ROWS} id=" in logs

        await wait_until(consumer_printed_all, timeout_s=300, interval_s=2,
                         what=f"the demo consumer to print message #{DEMO_ROWS}")
        migrate, spark_job, relay = [await asyncio.to_thread(_container, project, s)
                                     for s in ("migrate", "spark-job", "relay")]
        assert await asyncio.to_thread(_inspect, migrate, "{{.State.ExitCode}}") == "0"
        assert await asyncio.to_thread(_inspect, spark_job, "{{.State.ExitCode}}") == "0"
        assert await asyncio.to_thread(_inspect, relay, "{{.Config.User}}") == "10001:10001"

        async def relay_healthy() -> bool:
            return await asyncio.to_thread(
                _inspect, relay, "{{.State.Health.Status}}") == "healthy"

        await wait_until(relay_healthy, timeout_s=60, interval_s=1,
                         what="the relay service's HEALTHCHECK healthy")
        assert await count_rows(empty_db) == 0
        await asyncio.to_thread(compose, "stop", "-t", "30", "relay", timeout_s=90)
        assert await asyncio.to_thread(_inspect, relay, "{{.State.ExitCode}}") == "0"
    finally:
        await asyncio.to_thread(_compose, project, files, env, "down", "-t", "10",
                                timeout_s=120)
        await _drop_demo_queue(amqp_url)
