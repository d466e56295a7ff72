"""The project's images, built by .ci/image.sh, run as users run them: with host networking
against the machine's PostgreSQL and RabbitMQ. The runtime image migrates a new database,
delivers rows as uid 10001 on a read-only root filesystem, reports healthy by its own
HEALTHCHECK and stops on SIGTERM with exit 0 within the grace period, nothing lost; the spark
image's `spark-submit` runs the example job into the outbox.

Run by .ci/image.sh, which sets RELAY_TEST_IMAGE and RELAY_TEST_SPARK_IMAGE to the images it
built; the default test run leaves this folder out (tests/conftest.py), since it has no engine.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time

import pytest

from tests.helpers import count_rows, pg_fetchval, wait_until
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows

LABEL = "outbox-relay-ci"  # .ci/image.sh removes containers with this label
GRACE_S = 30  # docker stop's grace period, as a Deployment's terminationGracePeriodSeconds


def _image(variable: str) -> str:
    image = os.environ.get(variable)
    if not image:
        pytest.fail(f"{variable} is not set: run .ci/image.sh, which builds the images",
                    pytrace=False)
    return image


def docker(*args: str, timeout_s: float = 120, check: bool = True) -> str:
    """Run the docker client (DOCKER_HOST from .ci/image.sh); its stdout."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s,
                          check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])}... exited {done.returncode}: "
                             f"{done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def _relay_env(dsn: str, amqp_url: str, **extra: str) -> list[str]:
    env = {"RELAY_PG_DSN": dsn, "RELAY_AMQP_URL": amqp_url, "RELAY_POLL_INTERVAL_S": "1",
           **extra}
    return [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]


def container_logs(name: str) -> str:
    """What the container wrote (the relay logs to stderr)."""
    done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60,
                          check=False)
    return done.stdout + done.stderr


async def _docker(*args: str, timeout_s: float = 120) -> str:
    return await asyncio.to_thread(docker, *args, timeout_s=timeout_s)


async def test_runtime_image__migrates_delivers_reports_healthy_and_stops_cleanly(
    empty_db: str, amqp_url: str, broker_names: tuple[str, str]
) -> None:
    image = _image("RELAY_TEST_IMAGE")
    exchange, queue = broker_names
    env = _relay_env(empty_db, amqp_url)
    out = await _docker("run", "--rm", "--network", "host", "--label", LABEL, *env, image,
                        "migrate")
    assert "migrated" in out, out
    assert await count_rows(empty_db) == 0

    first = await insert_rows(empty_db, exchange, "rk", [{"n": i} for i in range(500)])
    port = free_port()
    name = f"relay-ci-{secrets.token_hex(3)}"
    consumer = await Consumer(amqp_url, queue).start()
    try:
        await _docker("run", "-d", "--name", name, "--label", LABEL, "--network", "host",
                      "--read-only", *_relay_env(empty_db, amqp_url, RELAY_HTTP_PORT=str(port)),
                      image)
        await consumer.wait_for(len(first), timeout_s=60)
        assert await _docker("exec", name, "id", "-u") == "10001"
        assert await pg_fetchval(
            empty_db, "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name LIKE 'outbox-relay %'") > 0

        async def healthy() -> bool:
            status = await _docker("inspect", "-f", "{{.State.Health.Status}}", name)
            assert status != "unhealthy", (await asyncio.to_thread(container_logs, name))[-3000:]
            return status == "healthy"

        # The image's own HEALTHCHECK (relay health, every 15 s).
        await wait_until(healthy, timeout_s=60, interval_s=1, what="HEALTHCHECK healthy")

        # Rows written while it stops: every one delivered by it or left in the outbox.
        second = await insert_rows(empty_db, exchange, "rk", [{"m": i} for i in range(500)])
        started = time.monotonic()
        await _docker("stop", "-t", str(GRACE_S), name, timeout_s=GRACE_S + 30)
        stop_s = time.monotonic() - started
        exit_code = await _docker("inspect", "-f", "{{.State.ExitCode}}", name)
        logs = await asyncio.to_thread(container_logs, name)
        assert exit_code == "0", logs[-3000:]
        assert stop_s < GRACE_S, f"stop took {stop_s:.1f}s"
        assert '"relay_stopped"' in logs
        await asyncio.sleep(1)  # the last confirms' messages reach the consumer
        delivered = set(consumer.ids)
        left = await count_rows(empty_db)
        assert set(first) <= delivered
        assert len(delivered & set(second)) + left == len(second), "a row was lost"
        print(f"\n[image] {image}: stopped in {stop_s:.1f}s, {left} rows left for the next relay")
    finally:
        await consumer.stop()
        await asyncio.to_thread(docker, "rm", "-f", name, check=False)


async def test_spark_image__spark_submit_runs_the_example_job_into_the_outbox(db: str) -> None:
    image = _image("RELAY_TEST_SPARK_IMAGE")
    out = await _docker(
        "run", "--rm", "--network", "host", "--label", LABEL, "-e", f"RELAY_PG_DSN={db}",
        "--entrypoint", "spark-submit", image,
        "--master", "local[2]", "--jars", "/usr/share/java/postgresql.jar",
        "/opt/relay/lib/python3.11/site-packages/relay/spark/example_job.py",
        "--date", "2024-05-01", "--transactions", "20000", "--merchants", "50",
        timeout_s=600)
    assert "50 events, 50 new" in out, out[-3000:]
    assert await count_rows(db) == 50
