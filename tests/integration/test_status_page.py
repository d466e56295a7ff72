"""The status page on the HTTP port, rendered by a running relay and looked at by a real
headless Chromium (Debian's `chromium`, installed by .ci/steps/ops.sh)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path
from urllib.parse import urlsplit

from tests.helpers import Env, pg_session, wait_until, with_user
from tests.integration.test_http import http_get
from tests.kit.ports import free_port
from tests.kit.producer import add_dead_letters, insert_rows
from tests.kit.proxy import TcpProxy, via_proxy

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--hide-scrollbars"]


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    """Run Debian's Chromium headless with a throw-away profile."""
    binary = shutil.which("chromium")
    assert binary, "chromium is missing: bash .ci/steps/ops.sh installs it"
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """Width, height and the number of distinct pixel byte values of an 8-bit RGB(A) PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw[: 4 * width * 200]))


async def _add_dead_letters(dsn: str) -> None:
    await add_dead_letters(dsn, 4, reason="exchange_not_found: orders")
    await add_dead_letters(dsn, 3, reason="unroutable: order.created")
    await insert_rows(dsn, "later", "rk", [{}] * 12, delay_s=3600)


async def test_status_page__renders_in_headless_chromium_with_the_relay_figures(
    env: Env, start_relay, tmp_path: Path
) -> None:
    await _add_dead_letters(env.pg_dsn)
    port = free_port()
    relay = start_relay(http_port=port)
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"n": i} for i in range(5)])

    async def page_ready() -> bool:
        status, text = await http_get(port, "/status")
        return status == 200 and ">1</div>" in text  # one relay's LISTEN session counted

    await wait_until(page_ready, timeout_s=60, what="status page with the relay connected")
    url = f"http://127.0.0.1:{port}/status"
    dom = chromium("--dump-dom", url, profile=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    for text in ("Dead letters by reason", "exchange_not_found", "unroutable", "Relays connected",
                 "Notify mode", "Rate in / out", "Oldest due row", "Delayed rows"):
        assert text in dom.stdout, text
    assert '<td class="n">4</td>' in dom.stdout
    assert '<td class="n">3</td>' in dom.stdout

    shot = tmp_path / "status.png"
    done = chromium(f"--screenshot={shot}", "--window-size=1100,760", url,
                    profile=tmp_path / "profile-shot")
    assert done.returncode == 0, done.stderr[-2000:]
    width, height, colours = png_size_and_colours(shot)
    assert (width, height) == (1100, 760)
    assert colours > 20  # text, cards and table, not a blank or an error page
    # RELAY_TEST_SCREENSHOT_DIR keeps the screenshot for a person to look at.
    keep = Path(os.environ.get("RELAY_TEST_SCREENSHOT_DIR", tmp_path))
    if keep != tmp_path:
        shutil.copy(shot, keep / "status-page.png")
    assert relay.terminate() == 0


async def test_status_page__says_why_when_the_database_cannot_be_read(
    env: Env, start_relay
) -> None:
    port = free_port()
    start_relay(http_port=port)

    async def up() -> bool:
        return (await http_get(port, "/status"))[0] == 200

    await wait_until(up, timeout_s=60, what="status page")
    async with pg_session(env.pg_dsn) as conn:
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE application_name LIKE 'outbox-relay status %' "
                           "AND datname = current_database()")
        await conn.execute("ALTER TABLE queue_message_dead RENAME TO queue_message_dead_x")

        async def explains() -> bool:
            status, text = await http_get(port, "/status")
            return status == 503 and "cannot read the status" in text

        await wait_until(explains, timeout_s=30, what="status page 503 with the reason")
        await conn.execute("ALTER TABLE queue_message_dead_x RENAME TO queue_message_dead")
    await wait_until(up, timeout_s=30, what="status page back")


async def test_status_page__polled_while_logins_fail_costs_a_handful_of_logins_and_names_no_host(
    env: Env, start_relay
) -> None:
    """500 requests to / while the relay's database login is refused: the page answers 503 at
    once from the last failure and tries again with backoff (before, every request logged in),
    and it names neither the server nor the user (the log has them)."""
    role = f"relay_pg_{secrets.token_hex(3)}"
    port = free_port()
    async with pg_session(env.pg_dsn) as admin:
        parts = urlsplit(env.pg_dsn)
        proxy = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
        try:
            await admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
            relay = start_relay(pg_dsn=via_proxy(with_user(env.pg_dsn, role), proxy.port),
                                http_port=port)

            async def up() -> bool:
                return (await http_get(port, "/"))[0] == 200

            await wait_until(up, timeout_s=60, what="the status page")
            await admin.execute(f"ALTER ROLE {role} NOLOGIN")
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE usename = $1", role)
            await asyncio.sleep(2.5)  # past the 2 s for which a sample is shown again
            before, started = proxy.connections_made, time.monotonic()
            pages = [await http_get(port, "/") for _ in range(500)]
            logins = proxy.connections_made - before
            took = time.monotonic() - started
            print(f"database logins during 500 requests to /: {logins} in {took:.1f}s")
            assert {status for status, _ in pages} == {503}
            # The relay's own sessions back off too (test_broker_outages: 8 logins in 6 s).
            assert logins <= 20, f"{logins} logins during 500 requests in {took:.1f}s"
            text = pages[-1][1]
            assert "cannot read the status" in text
            for secret in (role, f":{proxy.port}", parts.hostname or "127.0.0.1"):
                assert secret not in text, f"the page shows {secret!r}"
            await admin.execute(f"ALTER ROLE {role} LOGIN")
            await wait_until(up, timeout_s=60, what="the status page back")
            assert await relay.stop() == 0
        finally:
            await proxy.close()
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE usename = $1", role)
            with contextlib.suppress(Exception):
                await admin.execute(f"DROP ROLE IF EXISTS {role}")
