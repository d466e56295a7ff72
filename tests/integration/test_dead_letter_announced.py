"""A parked row is announced: one NOTIFY on the dead-letter channel and one WARNING in the
server's log per settle (however many rows it parks), and `relay dead watch` prints dead
letters as they come, catching up from `--since`."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from relay.pg.migrate import migrate
from relay.pg.queries import Queries, TableNames
from relay.settings import NotifyMode
from tests.chaos.pgcluster import PrivateCluster, remove_stale
from tests.helpers import RELAY_BIN, Env, pg_fetchval, pg_session, wait_until
from tests.kit.producer import insert_rows
from tests.kit.proxy import TcpProxy, via_proxy

NAMES = TableNames(None, "queue_message", "queue_message_notify")
Q = Queries(NAMES)
FORBIDDEN = {"userId": "mallory"}  # parked at once: `forbidden`, no broker round trip


async def _park(dsn: str, ids: list[str], reasons: list[str]) -> list[str]:
    """The relay's own dead_letter statement on these rows, in one transaction (one settle);
    the WARNING notices it raised."""
    notices: list[str] = []
    async with pg_session(dsn) as conn:
        conn.add_log_listener(lambda _c, msg: notices.append(f"{msg.severity} {msg.message}"))
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM queue_message WHERE id = ANY($1::uuid[]) "
                               "FOR UPDATE", ids)
            await conn.execute(Q["dead_letter"], ids, reasons, [True] * len(ids))
        await asyncio.sleep(0.1)  # notices arrive with the statement's reply; be generous
    return notices


async def test_one_settle_parking_three_rows__one_notify_and_one_warning(env: Env) -> None:
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"n": i} for i in range(3)])
    heard: list[str] = []
    async with pg_session(env.pg_dsn) as listener:
        await listener.add_listener(NAMES.dead_channel,
                                    lambda *args: heard.append(args[3]))
        notices = await _park(env.pg_dsn, ids, ["forbidden: a", "forbidden: b", "forbidden: c"])
        await wait_until(lambda: heard, timeout_s=10, what="the dead-letter notification")
        await asyncio.sleep(0.3)
    assert NAMES.dead_channel == "queue_message_notify_dead"
    assert len(heard) == 1, heard
    assert json.loads(heard[0]) == {"table": "queue_message", "count": 3, "id": ids[0],
                                    "reason": "forbidden: a"}
    warnings = [n for n in notices if n.startswith("WARNING")]
    assert warnings == [f"WARNING outbox-relay parked 3 row(s) of queue_message: first id "
                        f"{ids[0]}, reason: forbidden: a"]
    assert await pg_fetchval(env.pg_dsn, "SELECT count(*) FROM queue_message_dead") == 3


async def test_a_settle_that_parks_nothing__says_nothing(env: Env) -> None:
    heard: list[str] = []
    async with pg_session(env.pg_dsn) as listener:
        await listener.add_listener(NAMES.dead_channel, lambda *args: heard.append(args[3]))
        notices = await _park(env.pg_dsn, [], [])
        await asyncio.sleep(0.5)
    assert heard == []
    assert [n for n in notices if n.startswith("WARNING")] == []


async def test_the_relay_parking_rows__announces_them(env: Env, start_relay: Callable[..., Any],
                                                      ) -> None:
    heard: list[dict[str, Any]] = []
    async with pg_session(env.pg_dsn) as listener:
        await listener.add_listener(NAMES.dead_channel,
                                    lambda *args: heard.append(json.loads(args[3])))
        ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                                [{"n": i} for i in range(5)], options=FORBIDDEN)
        start_relay()
        await wait_until(lambda: sum(h["count"] for h in heard) >= 5, timeout_s=30,
                         what="notifications for the 5 parked rows")
    assert sum(h["count"] for h in heard) == 5
    assert {h["id"] for h in heard} <= set(ids)
    assert all(h["reason"].startswith("forbidden") for h in heard)


def _watch(env: Env, *args: str, pg_dsn: str | None = None) -> subprocess.Popen[bytes]:
    environ = env.relay_env() | ({"RELAY_PG_DSN": pg_dsn} if pg_dsn else {})
    return subprocess.Popen([RELAY_BIN, "dead", "watch", *args], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _read_lines(proc: subprocess.Popen[bytes], n: int, timeout_s: float,
                ) -> list[dict[str, Any]]:
    """n JSON lines from the watch's stdout (not a terminal: JSON lines), within the time."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lines: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(lines) < n:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise AssertionError(f"relay dead watch printed {len(lines)} of {n} dead letters "
                                 f"in {timeout_s} s: {lines}")
        chunk = os.read(fd, 65536)
        if not chunk:
            why = proc.stderr.read() if proc.stderr is not None else b""
            raise AssertionError(f"relay dead watch ended: {why!r}")
        _BUFFERS[fd] = _BUFFERS.get(fd, b"") + chunk
        while b"\n" in _BUFFERS[fd]:
            line, _BUFFERS[fd] = _BUFFERS[fd].split(b"\n", 1)
            lines.append(json.loads(line))
    return lines


_BUFFERS: dict[int, bytes] = {}  # what a watch printed past the last whole line, by pipe


async def _park_rows(env: Env, n: int, tag: str) -> list[str]:
    ids = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                            [{tag: i} for i in range(n)])
    await _park(env.pg_dsn, ids, [f"{tag}: {i}" for i in range(n)])
    return ids


async def test_dead_watch__catches_up_from_since_then_prints_each_as_it_comes(env: Env) -> None:
    before = await _park_rows(env, 2, "before")
    proc = _watch(env, "--since", "1h")
    try:
        first = await asyncio.to_thread(_read_lines, proc, 2, 30)
        later = await _park_rows(env, 3, "later")
        second = await asyncio.to_thread(_read_lines, proc, 3, 30)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
    assert [r["id"] for r in first] == before
    assert [r["id"] for r in second] == later
    assert [r["reason"] for r in second] == ["later: 0", "later: 1", "later: 2"]
    assert {"id", "dead_at", "attempts", "exchange", "routing_key", "reason"} <= set(first[0])
    assert code == 0
    assert proc.stderr is not None
    assert b"Traceback" not in proc.stderr.read()


async def test_dead_watch__without_since_prints_only_what_comes_after_it_began(
    env: Env,
) -> None:
    await _park_rows(env, 2, "old")
    proc = _watch(env)
    try:
        await asyncio.sleep(2)  # the watch has begun and looked
        new = await _park_rows(env, 1, "new")
        got = await asyncio.to_thread(_read_lines, proc, 1, 30)
        await asyncio.sleep(1)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout.fileno()], [], [], 0)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    assert [r["id"] for r in got] == new
    assert not ready, "the watch printed a dead letter parked before it began"


async def test_dead_watch__a_bad_since_is_a_usage_error_without_a_traceback(env: Env) -> None:
    done = await asyncio.to_thread(
        subprocess.run, [RELAY_BIN, "dead", "watch", "--since", "yesterday-ish"],
        env=env.relay_env(), capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert "--since" in done.stderr
    assert "Traceback" not in done.stderr


def test_dead_channel__fits_postgresqls_63_bytes_whatever_the_channel() -> None:
    long = TableNames(None, "queue_message", "c" * 63)
    assert len(long.dead_channel.encode()) <= 63
    assert long.dead_channel.endswith("_dead")


async def test_dead_channel__of_a_63_byte_channel_is_accepted_by_the_server(db: str) -> None:
    channel = TableNames(None, "queue_message", "é" * 31).dead_channel  # 62 bytes, then cut
    async with pg_session(db) as conn:
        await conn.execute("SELECT pg_notify($1, 'x')", channel)
        await conn.add_listener(channel, lambda *_: None)



async def test_dead_watch__a_lost_database_is_said_and_the_watch_goes_on_from_where_it_was(
    env: Env,
) -> None:
    """The link to PostgreSQL is cut while the watch runs and rows are parked meanwhile: the
    watch says so on stderr, and prints those rows once the link is back, none twice."""
    parts = urlsplit(env.pg_dsn)
    proxy = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    proc = _watch(env, pg_dsn=via_proxy(env.pg_dsn, proxy.port))
    try:
        await asyncio.sleep(2)  # the watch has begun
        first = await _park_rows(env, 1, "first")
        got = await asyncio.to_thread(_read_lines, proc, 1, 30)
        await proxy.cut()
        during = await _park_rows(env, 2, "during")
        await asyncio.sleep(7)  # the watch looks (every 5 s), finds the database gone
        await proxy.restore()
        after = await asyncio.to_thread(_read_lines, proc, 2, 40)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
        await proxy.close()
    assert [r["id"] for r in got] == first
    assert [r["id"] for r in after] == during
    assert code == 0
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    assert b"the database is unavailable" in stderr
    assert b"Traceback" not in stderr


async def test_the_warning__is_in_the_servers_own_log(tmp_path: Path) -> None:
    """On a private cluster whose log the test reads: one WARNING line per settle, with the
    table, the count, the first id and its reason, and the HINT."""
    remove_stale("relay-pg-warn-")
    cluster = PrivateCluster(prefix="relay-pg-warn-").init()
    try:
        await asyncio.to_thread(cluster.start)
        async with pg_session(cluster.dsn) as conn:
            await migrate(conn, NAMES, NotifyMode.CONDITIONAL)
        ids = await insert_rows(cluster.dsn, "x", "rk", [{"n": 1}, {"n": 2}])
        await _park(cluster.dsn, ids, ["too_large: 150 MiB", "too_large: 60 MiB"])
        await asyncio.sleep(0.5)
        log = cluster.log.read_text(errors="replace")
    finally:
        await asyncio.to_thread(cluster.destroy)
    lines = [line for line in log.splitlines() if "outbox-relay parked" in line]
    assert len(lines) == 1, log[-3000:]
    assert ("WARNING:  outbox-relay parked 2 row(s) of queue_message: first id "
            f"{ids[0]}, reason: too_large: 150 MiB") in lines[0]
    assert "HINT:  relay dead list shows them" in log
