"""`relay run` with RELAY_HTTP_PORT: real metrics, and readiness that follows the broker.

The broker is taken away from this relay only, by cutting a TCP proxy in front of the shared
RabbitMQ (tests/kit/proxy.py); the shared server keeps running for everyone else.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import RELAY_BIN, Env, count_rows, pg_execute, wait_until
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import insert_rows
from tests.kit.proxy import TcpProxy


async def http_get(port: int, path: str) -> tuple[int, str]:
    """One GET on 127.0.0.1; (0, error) when nothing answers."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), timeout=5
        )
    except (OSError, TimeoutError) as exc:
        return 0, str(exc)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: relay\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, parsed by prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = await http_get(port, path)
    return status, (json.loads(body) if status else {})


def via(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{proxy.port}"))


async def test_http__metrics_parse_and_readyz_follows_the_broker_through_a_cut(
    env: Env, consumer: Consumer, start_relay
) -> None:
    target = urlsplit(env.amqp_url)
    proxy = await TcpProxy(target.hostname or "127.0.0.1", target.port or 5672).start()
    port = free_port()
    try:
        relay = start_relay(
            amqp_url=via(env.amqp_url, proxy), http_port=port, backlog_poll_interval_s=0.5,
            poll_interval_s=1, reconnect_max_s=1,
        )

        async def ready() -> bool:
            return (await probe(port, "/readyz"))[0] == 200

        await wait_until(ready, timeout_s=60, interval_s=0.2, what="/readyz 200")
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                                [{"n": i} for i in range(20)])
        await consumer.wait_for(20)

        async def published_20() -> bool:
            status, text = await http_get(port, "/metrics")
            key = ("relay_messages_published_total", (("exchange", env.exchange),))
            return status == 200 and samples(text).get(key) == 20

        await wait_until(published_20, timeout_s=30, what="published counter at 20")
        _, text = await http_get(port, "/metrics")
        got = samples(text)
        assert got[("relay_connected", (("server", "rabbitmq"),))] == 1
        assert got[("relay_connected", (("server", "postgres"),))] == 1
        assert got[("relay_broker_blocked", ())] == 0
        assert got[("relay_message_age_at_confirm_seconds_count", ())] == 20
        assert got[("relay_batch_size_rows_sum", ())] == 20

        # The broker goes away (for this relay): not ready, with the reason; still alive.
        await proxy.cut()

        async def unready_for_broker() -> bool:
            status, body = await probe(port, "/readyz")
            return status == 503 and not body["checks"]["rabbitmq"]["ok"]

        await wait_until(unready_for_broker, timeout_s=30, interval_s=0.2,
                         what="/readyz 503 naming rabbitmq")
        _, body = await probe(port, "/readyz")
        assert any(r.startswith("rabbitmq:") for r in body["reasons"])
        assert (await probe(port, "/healthz"))[0] == 200

        # The port may be reachable by more people than the servers: the errors it shows
        # say what kind of failure, never which server or user (the log has the whole text;
        # the broker node, host:port, is shown on purpose: docs/operations.md).
        async def broker_error_known() -> bool:
            _, health = await probe(port, "/healthz")
            return bool(health["connections"]["broker"]["last_error"])

        await wait_until(broker_error_known, timeout_s=30, what="the broker's error in /healthz")
        _, health = await probe(port, "/healthz")
        _, readyz = await probe(port, "/readyz")
        shown = [str(c["last_error"]) for c in health["connections"].values()] + readyz["reasons"]
        for text in shown:
            for secret in (str(proxy.port), "127.0.0.1", "guest", "localhost", "amqp://"):
                assert secret not in text, f"an error on the HTTP port shows {secret!r}: {text}"
        assert "guest" not in (await http_get(port, "/healthz"))[1]
        held = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                                 [{"held": i} for i in range(5)])
        # Rows that have waited an hour: the lag is reported, but it is the table's (every
        # replica shares it), so the only reason this pod is unready is its own broker.
        await _age_rows(env.pg_dsn, seconds=3600)

        async def lag_reported_not_failing() -> bool:
            status, body = await probe(port, "/readyz")
            failing = {r.split(":")[0] for r in body.get("reasons", [])}
            oldest = body["info"]["backlog"]["oldest_due_age_s"] or 0
            return status == 503 and failing == {"rabbitmq"} and oldest >= 3600

        await wait_until(lag_reported_not_failing, timeout_s=30, interval_s=0.2,
                         what="/readyz reporting the lag, failing on rabbitmq only")
        assert await asyncio.to_thread(_health_cli, relay.env, "--ready") == 1
        assert await asyncio.to_thread(_health_cli, relay.env) == 0
        _, text = await http_get(port, "/metrics")
        assert samples(text)[("relay_connected", (("server", "rabbitmq"),))] == 0
        assert await count_rows(env.pg_dsn) == 5  # nothing claimed while the broker is away

        # The broker comes back: ready again, and the held rows go out.
        await proxy.restore()
        await wait_until(ready, timeout_s=60, interval_s=0.2, what="/readyz 200 again")
        await consumer.wait_for(25, timeout_s=60)
        assert set(ids + held) <= set(consumer.ids)
        assert await asyncio.to_thread(_health_cli, relay.env, "--ready") == 0
        assert await relay.stop() == 0
    finally:
        await proxy.close()


async def _age_rows(dsn: str, seconds: int) -> None:
    await pg_execute(
        dsn, "UPDATE queue_message SET created_at = now() - make_interval(secs => $1)", seconds
    )


def _health_cli(env: dict[str, str], *args: str) -> int:
    """Exit code of `relay health` against the running relay (what the image's HEALTHCHECK runs)."""
    return subprocess.run([RELAY_BIN, "health", *args], env=env, capture_output=True,
                          timeout=30, check=False).returncode
