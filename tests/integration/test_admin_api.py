"""The admin API on the HTTP port (relay/ops/admin.py): off without RELAY_ADMIN_TOKEN; with it,
a call without the token is refused and changes nothing, a parked row replayed through the API
reaches a consumer, purge deletes what matched, cross-site shapes of a request are refused,
and every call is logged."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from relay.ops.admin import REFUSALS_LOGGED
from relay.pg.deadletters import ADMIN_CONTENT_CHARS, ADMIN_LIST_MAX
from relay.pg.queries import Queries, TableNames
from tests.helpers import Env, pg_fetchval, pg_session, wait_until
from tests.integration.test_status_page import CHROMIUM_FLAGS
from tests.kit.consumer import Consumer
from tests.kit.ports import free_port
from tests.kit.producer import add_dead_letters, insert_rows

Q = Queries(TableNames(None, "queue_message", "queue_message_notify"))
TOKEN = "s3cret-admin-token-0123456789"


async def call(port: int, method: str, path: str, *, token: str | None = TOKEN,
               body: Any = None, content_type: str = "application/json",
               ) -> tuple[int, Any]:
    """One request on 127.0.0.1; the status and the JSON answer."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    payload = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", "Host: relay", f"Content-Length: {len(payload)}"]
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    if body is not None:
        head.append(f"Content-Type: {content_type}")
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=15)
    finally:
        writer.close()
    status_line, _, rest = raw.decode().partition("\r\n")
    _, _, text = rest.partition("\r\n\r\n")
    return int(status_line.split()[1]), json.loads(text) if text.strip() else None


async def _parked(env: Env, n: int) -> list[str]:
    """n good rows parked as dead letters (the relay's own statement, one settle)."""
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                            [{"parked": i} for i in range(n)])
    async with pg_session(env.pg_dsn) as conn, conn.transaction():
        await conn.execute(Q["dead_letter"], ids, ["exchange was missing"] * n, [True] * n)
    return ids


async def _dead(env: Env) -> int:
    return int(await pg_fetchval(env.pg_dsn, "SELECT count(*) FROM queue_message_dead"))


async def _up(port: int) -> None:
    async def answers() -> bool:
        try:
            status, _ = await call(port, "GET", "/admin/dead")
        except (OSError, TimeoutError):
            return False
        return status != 0

    await wait_until(answers, timeout_s=30, what="the relay's HTTP port")


async def test_admin_api__token_refusals_then_a_replay_that_reaches_the_consumer(
    env: Env, consumer: Consumer, start_relay: Any,
) -> None:
    parked = await _parked(env, 3)
    port = free_port()
    relay = start_relay(http_port=port, admin_token=TOKEN)
    await _up(port)
    # Without the token, or with another one: refused, nothing changes.
    assert (await call(port, "POST", "/admin/dead/replay", token=None,
                       body={"all": True}))[0] == 401
    assert (await call(port, "POST", "/admin/dead/replay", token="x" * 30,
                       body={"all": True}))[0] == 401
    assert (await call(port, "GET", "/admin/dead", token=None))[0] == 401
    # What a page of another site can send without a preflight: a form body, no JSON.
    assert (await call(port, "POST", "/admin/dead/replay", body={"all": True},
                       content_type="application/x-www-form-urlencoded"))[0] == 415
    assert (await call(port, "OPTIONS", "/admin/dead/replay"))[0] == 405
    assert await _dead(env) == 3
    # With it: list, show, then replay one; it is published and arrives.
    status, listing = await call(port, "GET", "/admin/dead?limit=10")
    assert status == 200
    assert sorted(r["id"] for r in listing) == sorted(parked)
    status, shown = await call(port, "GET", f"/admin/dead/{parked[0]}")
    assert status == 200
    assert shown[0]["reason"] == "exchange was missing"
    assert (await call(port, "GET", "/admin/dead/00000000-0000-0000-0000-000000000000"))[0] \
        == 404
    assert (await call(port, "POST", "/admin/dead/replay", body={}))[0] == 400
    assert (await call(port, "POST", "/admin/dead/replay", body={"ids": "one"}))[0] == 400
    status, would = await call(port, "POST", "/admin/dead/replay",
                               body={"ids": [parked[0]], "dry_run": True})
    assert (status, would) == (200, {"would": 1})
    status, replayed = await call(port, "POST", "/admin/dead/replay", body={"ids": [parked[0]]})
    assert (status, replayed) == (200, {"replayed": [parked[0]], "left": []})
    await consumer.wait_for(1, timeout_s=30)
    assert consumer.ids == [parked[0]]
    # Purge what matched, nothing else.
    status, purged = await call(port, "POST", "/admin/dead/purge", body={"ids": [parked[1]]})
    assert (status, purged) == (200, {"purged": 1})
    assert await _dead(env) == 1
    events = [e for e in relay.log_events() if e.get("event") in {"admin_call",
                                                                  "admin_refused"}]
    assert [e["status"] for e in events if e["event"] == "admin_refused"][:3] == [401, 401, 401]
    assert any(e.get("did") == "replayed 1, left 0" for e in events)
    assert any(e.get("did") == "purged 1" for e in events)
    assert TOKEN not in relay.log_text()


BIG_CONTENT_CHARS = 150 * 1024 * 1024
MEMORY_LIMIT_BYTES = 384 * 1024 * 1024  # the Deployment's (deploy/)


def _peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (VmHWM) so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


async def test_admin_api__a_150_mib_letter_is_shown_cut_and_listings_are_capped(
    env: Env, start_relay: Any,
) -> None:
    """A parked too_large row of 150 MiB: its detail answers a bounded cut of the content with
    the whole size, and the relay stays under its memory limit (it read the whole once)."""
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"small": True}])
    async with pg_session(env.pg_dsn) as conn:
        # Made on the server: the test does not hold it either.
        await conn.execute("UPDATE queue_message SET content = to_jsonb(repeat('x', $1)) "
                           "WHERE id = $2::uuid", BIG_CONTENT_CHARS, ids[0])
        async with conn.transaction():
            await conn.execute(Q["dead_letter"], ids, ["too_large: 150 MiB"], [True])
    port = free_port()
    relay = start_relay(http_port=port, admin_token=TOKEN)
    await _up(port)
    status, shown = await call(port, "GET", f"/admin/dead/{ids[0]}")
    assert status == 200
    assert shown[0]["content_bytes"] == BIG_CONTENT_CHARS + 2  # the JSON string's quotes
    assert shown[0]["content_cut"] is True
    assert len(shown[0]["content"]) == ADMIN_CONTENT_CHARS
    assert shown[0]["reason"] == "too_large: 150 MiB"
    peak = _peak_rss_bytes(relay.pid)
    assert peak < MEMORY_LIMIT_BYTES, f"peak {peak / 2**20:.0f} MiB"
    status, refused = await call(port, "GET", f"/admin/dead?limit={ADMIN_LIST_MAX + 1}")
    assert status == 400
    assert f"from 1 to {ADMIN_LIST_MAX}" in refused["error"]
    assert (await call(port, "GET", f"/admin/dead?limit={ADMIN_LIST_MAX}"))[0] == 200


async def test_admin_api__off_without_a_token(env: Env, start_relay: Any) -> None:
    await _parked(env, 1)
    port = free_port()
    start_relay(http_port=port)
    await _up(port)
    status, body = await call(port, "POST", "/admin/dead/purge", body={"all": True})
    assert status == 404
    assert "RELAY_ADMIN_TOKEN" in body["error"]
    assert await _dead(env) == 1


async def test_admin_port__the_api_answers_there_only_and_refusals_are_logged_at_a_bound(
    env: Env, start_relay: Any,
) -> None:
    """RELAY_ADMIN_PORT: the calls answer on that port (the loopback), the HTTP port says where
    they are and changes nothing; 40 calls with a wrong token write at most 10 log lines."""
    parked = await _parked(env, 2)
    port, admin_port = free_port(), free_port()
    relay = start_relay(http_port=port, admin_port=admin_port, admin_token=TOKEN)
    await _up(admin_port)
    status, body = await call(port, "POST", "/admin/dead/purge", body={"all": True})
    assert status == 404
    assert "RELAY_ADMIN_PORT" in body["error"]
    assert await _dead(env) == 2
    status, listing = await call(admin_port, "GET", "/admin/dead")
    assert status == 200
    assert sorted(r["id"] for r in listing) == sorted(parked)
    listening = {e["port"]: e for e in relay.log_events() if e.get("event") == "http_listening"}
    assert listening[admin_port]["host"] == "127.0.0.1"
    assert listening[admin_port]["admin"]
    assert not listening[port]["admin"]
    for _ in range(40):
        assert (await call(admin_port, "GET", "/admin/dead", token="x" * 30))[0] == 401
    refused = [e for e in relay.log_events() if e.get("event") == "admin_refused"]
    # The HTTP port's 404 above, then at most the bound of the wrong tokens' 40.
    assert len(refused) <= 1 + REFUSALS_LOGGED, len(refused)
    assert len(refused) >= REFUSALS_LOGGED, "refusals are logged, up to the bound"
    assert (await call(admin_port, "GET", "/admin/dead", token="x" * 30))[0] == 401
    assert (await call(port, "GET", "/healthz", token=None))[0] == 200


async def test_admin_token__a_weak_one_stops_start_up_naming_the_setting(
    env: Env, start_relay: Any,
) -> None:
    relay = start_relay(http_port=free_port(), admin_token="short")
    code = await asyncio.to_thread(relay.proc.wait, 30) if relay.proc else None
    assert code == 2
    assert "RELAY_ADMIN_TOKEN" in relay.log_text()
    assert "short" not in relay.log_text()
    assert "Traceback" not in relay.log_text()


def _high(fd: int) -> int:
    """The same pipe end as a file descriptor of 10 or more (the old one closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class DevToolsError(Exception):
    """The browser refused a command (a page that was navigating away, a script error)."""


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
    the browser reads commands on its fd 3 and answers on its fd 4, NUL-terminated JSON)."""

    def __init__(self, profile: Path) -> None:
        binary = shutil.which("chromium")
        assert binary, "chromium is missing: bash .ci/steps/ops.sh installs it"
        # Every end above fd 10: the shell below moves two of them onto fds 3 and 4, which
        # must not be one of the ends themselves.
        to_browser_r, self._to_browser, self._from_browser, from_browser_w = (
            _high(fd) for fd in (*os.pipe(), *os.pipe()))
        # bash puts the two pipe ends on fds 3 and 4, then becomes the browser.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}', binary,
             *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             "about:blank"], pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._buffer = b""
        self.session: str | None = None

    def send(self, method: str, timeout_s: float = 30, **params: Any) -> dict[str, Any]:
        """One command (on the attached page once there is one); its result."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next:
                    if "error" in answer:
                        raise DevToolsError(str(answer["error"]))
                    return dict(answer.get("result", {}))
            ready, _, _ = select.select([self._from_browser], [], [],
                                        max(deadline - time.monotonic(), 0))
            if not ready:
                raise AssertionError(f"Chromium did not answer {method} in {timeout_s} s")
            chunk = os.read(self._from_browser, 1 << 16)
            assert chunk, "Chromium closed its DevTools pipe"
            self._buffer += chunk

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", url=url)["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]

    def evaluate(self, expression: str) -> Any:
        """A script's value (a promise is awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise DevToolsError(str(result["exceptionDetails"]))
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 20) -> Any:
        """The script's value once it is truthy; a page loading (or reloading itself every
        few seconds) in between is waited out."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = self.evaluate(expression)
            except DevToolsError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout_s} s in Chromium for: {expression}")
            time.sleep(0.1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._to_browser)
        self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self._from_browser)


# Type the token into the page's field and press a button (BUTTON: its selector), answering
# its confirm dialog yes; what the dialog asked and what the page says of the call are kept in
# the tab's sessionStorage (the page reloads itself every 5 s).
CLICK = """
(() => {
  sessionStorage.removeItem('relay-admin-result');
  sessionStorage.removeItem('relay-test-confirm');
  window.confirm = (m) => { sessionStorage.setItem('relay-test-confirm', m); return true; };
  const token = document.getElementById('token');
  token.value = TOKEN; token.dispatchEvent(new Event('input'));
  document.querySelector(BUTTON).click();
  return true;
})()
"""
PAGE_READY = ("document.readyState === 'complete' "
              "&& !!document.querySelector('button[data-act=replay]')")
RESULT = "sessionStorage.getItem('relay-admin-result')"
CONFIRMED = "sessionStorage.getItem('relay-test-confirm') || ''"


def _press(browser: DevTools, url: str, token: str, act: str = "replay",
           reason: str | None = None) -> tuple[str, str]:
    """Press a button of the page: what the page said of it, and what its confirm asked."""
    button = f'button[data-act="{act}"]' + (f'[data-reason="{reason}"]' if reason else "")
    browser.open(url)
    browser.wait_for(PAGE_READY)
    browser.wait_for(CLICK.replace("TOKEN", json.dumps(token))
                     .replace("BUTTON", json.dumps(button)))
    result = str(browser.wait_for(RESULT))
    return result, str(browser.evaluate(CONFIRMED))


async def test_status_page__a_parked_row_replayed_from_the_page_reaches_the_consumer(
    env: Env, consumer: Consumer, start_relay: Any, tmp_path: Path,
) -> None:
    """In a real headless Chromium: the Replay button with a wrong token is refused and changes
    nothing; with the token the row goes back into the outbox and arrives."""
    parked = await _parked(env, 1)
    port = free_port()
    start_relay(http_port=port, admin_token=TOKEN)
    await _up(port)
    browser = DevTools(tmp_path / "profile")
    url = f"http://127.0.0.1:{port}/status"
    try:
        refused, _ = await asyncio.to_thread(_press, browser, url, "wrong" * 5)
        assert await _dead(env) == 1
        done, asked = await asyncio.to_thread(_press, browser, url, TOKEN)
    finally:
        browser.close()
    assert refused.startswith("replay exchange was missing: a valid `Authorization"), refused
    assert asked == 'Replay 1 dead letter(s) of reason "exchange was missing"?'
    assert done == "replay exchange was missing: replayed 1, left 0"
    await consumer.wait_for(1, timeout_s=30)
    assert consumer.ids == parked
    assert await _dead(env) == 0


async def test_status_page__purge_deletes_exactly_the_reason_code_it_names_and_says_how_many(
    env: Env, start_relay: Any, tmp_path: Path,
) -> None:
    """In a real headless Chromium: 2 letters of reason `internal` and 50 whose text names an
    exchange `x-internal`. The page's Purge of `internal` used to ask "every dead letter whose
    reason contains internal?" and delete all 52; it now asks about the 2 and deletes those."""
    await add_dead_letters(env.pg_dsn, 2, reason="internal: a bug in the relay's path")
    await add_dead_letters(env.pg_dsn, 50, exchange="x-internal",
                           reason="exchange_not_found: exchange 'x-internal' in vhost '/'")
    port = free_port()
    start_relay(http_port=port, admin_token=TOKEN)
    await _up(port)
    browser = DevTools(tmp_path / "profile")
    try:
        done, asked = await asyncio.to_thread(
            _press, browser, f"http://127.0.0.1:{port}/status", TOKEN, "purge", "internal")
    finally:
        browser.close()
    assert asked == 'Delete 2 dead letter(s) of reason "internal"?'
    assert done == "purge internal: purged 2"
    left = await pg_fetchval(env.pg_dsn, "SELECT array_agg(DISTINCT split_part(reason, ':', 1)) "
                                         "FROM queue_message_dead")
    assert (left, await _dead(env)) == (["exchange_not_found"], 50)
