"""A small HTTP endpoint on asyncio streams: /metrics, /healthz and /readyz, the status page
and, when a token is set, the admin API (relay/ops/admin.py).

No web framework: a few routes, one request per connection; the probes are answered from state
the process already holds (they never query a server themselves; the backlog comes from the
bounded-rate poller in relay/ops/metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST

from relay.errors import ConfigError
from relay.ops.admin import MAX_BODY, AdminApi
from relay.ops.metrics import BacklogSnapshot
from relay.ops.statuspage import StatusPage

log = structlog.get_logger("relay.ops.http")

_MAX_HEADER_LINES = 100
_READ_TIMEOUT_S = 5.0
# Connections open at once, far below a container's usual open-file limit (1,024), which the
# relay's database and broker connections share. Past it, a new connection closes the oldest one
# still waiting for its request (an idle client): a flood of idle connections neither takes the
# process's descriptors nor keeps a liveness probe out.
MAX_CONNECTIONS = 128
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 413: "Content Too Large",
            415: "Unsupported Media Type", 503: "Service Unavailable"}


@dataclass
class Check:
    """One named check of a probe: whether it passes and why."""

    ok: bool
    detail: str


@dataclass
class Health:
    """The inputs of /healthz and /readyz, read at request time.

    The callables read state the relay already keeps (connection flags, the last loop
    activity, the last backlog poll), so a probe costs no query.
    """

    worker_alive: Callable[[], bool]
    last_activity: Callable[[], float]  # time.monotonic() of the last loop wake-up or batch
    postgres_connected: Callable[[], bool]
    rabbitmq_connected: Callable[[], bool]
    broker_blocked: Callable[[], bool]
    backlog: Callable[[], BacklogSnapshot]
    ready_max_lag_s: float
    stall_after_s: float
    backlog_stale_after_s: float
    # Every supervised connection's state (relay/supervise.py), shown in /healthz; no check.
    connections: Callable[[], dict[str, dict[str, object]]] | None = None

    def _cause(self, name: str) -> str:
        """': <the kind of the last error>' of a supervised connection, when one is known."""
        state = (self.connections() if self.connections else {}).get(name) or {}
        error = public_error(state.get("last_error"))
        return f": {error}" if error else ""

    def public_connections(self) -> dict[str, dict[str, object]]:
        """Every supervised connection's state as /healthz shows it: the last error's kind,
        not its text, which names servers (host, port, user, database)."""
        states = self.connections() if self.connections else {}
        return {name: {**state, "last_error": public_error(state.get("last_error"))}
                for name, state in states.items()}

    def liveness(self, now: float | None = None) -> dict[str, Check]:
        """The loop task is running and made progress recently (or waits for the broker)."""
        now = time.monotonic() if now is None else now
        checks = {"worker": Check(self.worker_alive(), "relay loop task running")}
        if not checks["worker"].ok:
            checks["worker"].detail = "relay loop task has ended"
        idle_s = now - self.last_activity()
        if idle_s <= self.stall_after_s:
            checks["loop"] = Check(True, f"last activity {idle_s:.1f}s ago")
        elif not self.rabbitmq_connected() or self.broker_blocked():
            # Lanes park while the broker is away or blocks publishers; readiness reports that,
            # liveness must not restart a process that is merely waiting.
            checks["loop"] = Check(True, f"waiting for RabbitMQ ({idle_s:.0f}s)")
        else:
            checks["loop"] = Check(
                False, f"no loop activity for {idle_s:.0f}s (limit {self.stall_after_s:g}s)"
            )
        return checks

    def readiness(self, now: float | None = None) -> dict[str, Check]:
        """This pod can work: both servers connected, the broker not blocking it.

        The backlog's lag is the table's, shared by every replica: were it a readiness check,
        a backlog would turn every pod unready at once (and stall a rollout with
        maxUnavailable 0). It counts only when RELAY_READY_MAX_LAG_S is set; otherwise it is
        reported (`info`) and alerted on from the metrics.
        """
        now = time.monotonic() if now is None else now
        checks: dict[str, Check] = {}
        pg = self.postgres_connected()
        checks["postgres"] = Check(pg, "connected" if pg else "LISTEN connection is down")
        mq = self.rabbitmq_connected()
        checks["rabbitmq"] = Check(
            mq, "connected" if mq else "broker connection is down" + self._cause("broker"))
        blocked = self.broker_blocked()
        checks["flow_control"] = Check(
            not blocked,
            "broker blocks publishers (memory or disk alarm)" if blocked else "not blocked",
        )
        strangers = (self.backlog().figures or {}).get("lock_strangers") or []
        if strangers:
            # No host or user: the port may be reachable by more people than the database.
            held = ", ".join(f"{h['role']} by pid {h['pid']} ({h['application_name']!r})"
                             for h in strangers)
            checks["locks"] = Check(False, "a session that is not a relay holds this table's "
                                           f"relay lock: {held}")
        if self.ready_max_lag_s > 0:
            checks["lag"] = self._lag_check(now)
        return checks

    def backlog_info(self, now: float | None = None) -> dict[str, Any]:
        """The backlog as the last poll saw it, for /readyz's `info` (never a failure)."""
        now = time.monotonic() if now is None else now
        snap = self.backlog()
        age = snap.age_s(now)
        figures = snap.figures or {}
        return {"due_rows": figures.get("due"), "oldest_due_age_s": figures.get("oldest_due_age_s"),
                "polled_s_ago": None if age is None else round(age, 1),
                "error": public_error(snap.error)}

    def _lag_check(self, now: float) -> Check:
        snap = self.backlog()
        age = snap.age_s(now)
        if snap.figures is None or age is None:
            return Check(False, f"backlog not polled yet{_suffix(snap.error)}")
        if age > self.backlog_stale_after_s:
            return Check(False, f"backlog poll is {age:.0f}s old{_suffix(snap.error)}")
        oldest = float(snap.figures.get("oldest_due_age_s") or 0.0)
        due = snap.figures.get("due")
        if oldest > self.ready_max_lag_s:
            return Check(
                False,
                f"oldest due row is {oldest:.1f}s old (limit {self.ready_max_lag_s:g}s, "
                f"{due} due rows)",
            )
        return Check(True, f"oldest due row {oldest:.1f}s old, {due} due rows")


def public_error(error: object) -> str | None:
    """An error as the HTTP port shows it: its kind (what comes before the first ':', the
    exception's name as the supervisor writes it, or the step that failed), never the rest,
    which names hosts, ports, users and databases; the relay's log has the whole text."""
    if not error:
        return None
    kind = str(error).split(":", 1)[0].strip()
    return f"{kind} (details in the relay's log)"


def _suffix(error: str | None) -> str:
    return f": {public_error(error)}" if error else ""


def probe_body(checks: dict[str, Check],
               info: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """HTTP status and JSON document of a probe: 200 when every check passes, else 503."""
    ok = all(c.ok for c in checks.values())
    body: dict[str, Any] = {
        "status": "ok" if ok else "failing",
        "checks": {name: {"ok": c.ok, "detail": c.detail} for name, c in checks.items()},
        "reasons": [f"{name}: {c.detail}" for name, c in checks.items() if not c.ok],
    }
    if info is not None:
        body["info"] = info
    return (200 if ok else 503), body


class HttpServer:
    """Serves /metrics, /healthz, /readyz and (when given) the status page until closed."""

    def __init__(
        self,
        host: str,
        port: int,
        health: Health,
        render_metrics: Callable[[], bytes],
        status_page: StatusPage | None = None,
        *,
        admin: AdminApi | None = None,
        setting: str = "RELAY_HTTP_PORT",
    ) -> None:
        self.host = host
        self.port = port
        self.setting = setting  # the setting that named the port, for a bind error
        self.health = health
        self._render_metrics = render_metrics
        self.status_page = status_page
        self.admin = admin
        self._server: asyncio.Server | None = None
        # Open connections, oldest first: True while still waiting for the request.
        self._connections: dict[asyncio.StreamWriter, bool] = {}
        self.evicted = 0  # idle connections closed to make room

    async def start(self) -> None:
        """Bind and listen; a port already taken is a configuration error."""
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as exc:
            raise ConfigError(
                f"{self.setting}: cannot listen on {self.host}:{self.port}: {exc.strerror}"
            ) from exc
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("http_listening", host=self.host, port=self.port,
                 admin=self.admin is not None and self.admin.on)

    async def close(self) -> None:
        """Stop listening; safe to call twice."""
        server, self._server = self._server, None
        if self.status_page is not None:
            await self.status_page.close()
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=2)

    def route(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request (no I/O: easy to test)."""
        path = path.split("?", 1)[0]
        if method not in {"GET", "HEAD"}:
            return 405, "text/plain; charset=utf-8", b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self._render_metrics()
        if path in {"/healthz", "/livez"}:
            status, body = probe_body(self.health.liveness())
            if self.health.connections is not None:
                body["connections"] = self.health.public_connections()
        elif path == "/readyz":
            status, body = probe_body(self.health.readiness(),
                                      {"backlog": self.health.backlog_info()})
        else:
            return (404, "text/plain; charset=utf-8",
                    b"not found: try /status /metrics /healthz /readyz\n")
        return status, "application/json", (json.dumps(body) + "\n").encode()

    async def respond(self, method: str, path: str, headers: dict[str, str] | None = None,
                      body: bytes = b"") -> tuple[int, str, bytes]:
        """route(), plus the status page, which reads the database (cached, rate-bounded), and
        the admin API."""
        if self.admin is not None and AdminApi.mine(path):
            return await self.admin.handle(method, path, headers or {}, body)
        page = self.status_page
        if page is not None and method in {"GET", "HEAD"} and path.split("?", 1)[0] in {
            "/", "/status"
        }:
            status, body = await page.html()
            return status, "text/html; charset=utf-8", body
        return self.route(method, path)

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Room for a new connection: at the cap, the oldest one still waiting for its request
        is closed; False when every open connection is being answered."""
        if len(self._connections) >= MAX_CONNECTIONS:
            idle = next((w for w, waiting in self._connections.items() if waiting), None)
            if idle is None:
                return False
            self._connections.pop(idle)
            idle.transport.abort()
            self.evicted += 1
        self._connections[writer] = True
        return True

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.transport.abort()
            return
        try:
            request = await asyncio.wait_for(_read_request(reader), timeout=_READ_TIMEOUT_S)
            if request is None:
                return
            if writer in self._connections:
                self._connections[writer] = False  # answering: never closed to make room
            method, path, headers, payload = request
            status, ctype, body = await self.respond(method, path, headers, payload)
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head if method == "HEAD" else head + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # a client that hangs up or talks nonsense gets nothing
        except Exception:  # a bug in one request must not take the endpoint down
            log.exception("http_request_failed")
        finally:
            self._connections.pop(writer, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader,
                        ) -> tuple[str, str, dict[str, str], bytes] | None:
    """Method, path, headers (names in lower case) and body (at most MAX_BODY bytes, by its
    Content-Length) of one HTTP/1.x request."""
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError("not an HTTP request")
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADER_LINES):
        header = await reader.readline()
        if header in {b"\r\n", b"\n", b""}:
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or "0")
    if length < 0 or length > MAX_BODY:
        raise ValueError("a request body over the limit")
    body = await reader.readexactly(length) if length else b""
    return parts[0].upper(), parts[1], headers, body
