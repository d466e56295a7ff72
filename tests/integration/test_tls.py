"""TLS: amqps:// with a CA file reaches the broker; libpq sslmode is honoured, not ignored.

The shared servers speak plain TCP, so TLS to RabbitMQ is terminated by a proxy in the test
(tests/kit/proxy.py) with a certificate made for the test; PostgreSQL here has ssl=off, so
`sslmode=require` must fail with the server's own answer, and `sslmode=disable` must work.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers import Env
from tests.integration.test_security import relay_cmd
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows
from tests.kit.proxy import TcpProxy


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1 (cert, key)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


async def test_tls__amqps_with_a_ca_file_publishes_through_a_tls_endpoint(
    env: Env, consumer: Consumer, start_relay, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    target = urlsplit(env.amqp_url)
    proxy = await TcpProxy(target.hostname or "127.0.0.1", target.port or 5672,
                           tls=context).start()
    try:
        user = f"{target.username}:{target.password}"
        # In a thread: the proxy runs on this test's event loop and must keep serving.
        untrusted = await asyncio.to_thread(
            relay_cmd, env, "run", amqp_url=f"amqps://{user}@localhost:{proxy.port}/",
            startup_timeout_s=3,  # an untrusted certificate is retried until the bound
        )
        assert untrusted.returncode != 0
        assert "certificate verify failed" in untrusted.stderr
        assert f":{target.password}@" not in untrusted.stderr

        start_relay(amqp_url=f"amqps://{user}@localhost:{proxy.port}/?cafile={cert}")
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                                [{"tls": i} for i in range(10)])
        await consumer.wait_for(10)
        assert set(ids) <= set(consumer.ids)
        assert proxy.connections_made >= 1
    finally:
        await proxy.close()


@pytest.mark.parametrize("form", ["url", "keyword"])
async def test_tls__libpq_sslmode_is_honoured(env: Env, form: str) -> None:
    parts = urlsplit(env.pg_dsn)

    def dsn(mode: str) -> str:
        if form == "url":
            return f"{env.pg_dsn}?sslmode={mode}"
        return (f"host={parts.hostname} port={parts.port or 5432} user={parts.username} "
                f"dbname={parts.path.lstrip('/')} sslmode={mode}")

    plain = relay_cmd(env, "status", pg_dsn=dsn("disable"))
    assert plain.returncode == 0, plain.stderr
    required = relay_cmd(env, "status", pg_dsn=dsn("require"))
    assert required.returncode != 0
    assert "SSL" in required.stderr
