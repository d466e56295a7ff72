"""The admin API on the HTTP port (relay/ops/admin.py): off without RELAY_ADMIN_TOKEN; with it,
a call without the token is refused and changes nothing, a parked row replayed through the API
reaches a consumer, purge deletes what matched, cross-site shapes of a request are refused,
and every call is logged."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from relay.pg.queries import Queries, TableNames
from tests.helpers import Consumer, Env, insert_rows, pg_fetchval, pg_session, wait_until
from tests.proxy import free_port

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
    assert consumer.ids() == [parked[0]]
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


async def test_admin_api__off_without_a_token(env: Env, start_relay: Any) -> None:
    await _parked(env, 1)
    port = free_port()
    start_relay(http_port=port)
    await _up(port)
    status, body = await call(port, "POST", "/admin/dead/purge", body={"all": True})
    assert status == 404
    assert "RELAY_ADMIN_TOKEN" in body["error"]
    assert await _dead(env) == 1


async def test_admin_token__a_weak_one_stops_start_up_naming_the_setting(
    env: Env, start_relay: Any,
) -> None:
    relay = start_relay(http_port=free_port(), admin_token="short")
    code = await asyncio.to_thread(relay.proc.wait, 30) if relay.proc else None
    assert code == 2
    assert "RELAY_ADMIN_TOKEN" in relay.log_text()
    assert "short" not in relay.log_text()
    assert "Traceback" not in relay.log_text()
