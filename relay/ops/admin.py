"""The admin API on the HTTP port: list, show, replay and purge dead letters (`/admin/dead`).

Off unless RELAY_ADMIN_TOKEN is set. Every call, reading or changing, must carry
`Authorization: Bearer <token>` (compared in constant time); a browser sends that header to
another site only after a CORS preflight, which this port never answers, so a page elsewhere
cannot make a logged-in operator's browser call it. Change-making calls are POSTs with a JSON
body (`Content-Type: application/json`, which an HTML form cannot send). Every call is logged
with what it did (`admin_call`), refused ones too (`admin_refused`), at a bounded rate: a
flood of refused calls writes at most REFUSALS_LOGGED lines a minute, the next line says how
many were left out (`suppressed`). With RELAY_ADMIN_PORT the API answers on that port only;
the HTTP port then says where it is.

What a call does is the dead-letter commands' logic (relay/pg/deadletters.py), reached through
`DeadLetterAction`, which relay/app.py provides: this module sees no database.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import structlog

from relay.errors import DatabaseError, RelayError

log = structlog.get_logger("relay.ops.admin")

# (action, arguments) -> a JSON-able result. Actions: list (limit, reason), show (id),
# replay and purge (ids, reason, older_than, all, limit, dry_run). A user's mistake raises
# a RelayError that is not a DatabaseError; an unreachable database a DatabaseError.
DeadLetterAction = Callable[[str, dict[str, Any]], Awaitable[Any]]
Response = tuple[int, str, bytes]

PREFIX = "/admin/"
MAX_BODY = 64 * 1024
JSON = "application/json"
_FILTER_KEYS = {"ids", "reason", "older_than", "all", "limit", "dry_run"}
# Refused calls logged at most this many per REFUSALS_WINDOW_S (a flood must not flood the log).
REFUSALS_LOGGED = 10
REFUSALS_WINDOW_S = 60.0


class BoundedLog:
    """An event written at most `burst` times in any `window_s`; the lines held back are counted
    and the next line written says how many (`suppressed`)."""

    def __init__(self, event: str, *, burst: int = REFUSALS_LOGGED,
                 window_s: float = REFUSALS_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.event = event
        self._burst = burst
        self._window_s = window_s
        self._clock = clock
        self._written: list[float] = []
        self.suppressed = 0  # held back since the last line written

    def __call__(self, **fields: Any) -> bool:
        """Write the event now if the budget allows; True when written."""
        now = self._clock()
        self._written = [t for t in self._written if now - t < self._window_s]
        if len(self._written) >= self._burst:
            self.suppressed += 1
            return False
        self._written.append(now)
        extra = {"suppressed": self.suppressed} if self.suppressed else {}
        self.suppressed = 0
        log.info(self.event, **fields, **extra)
        return True


def _reply(status: int, body: Any) -> Response:
    return status, JSON, (json.dumps(body, default=str) + "\n").encode()


class AdminApi:
    """Routes /admin/... requests to the dead-letter actions, behind the token."""

    def __init__(self, token: str | None, action: DeadLetterAction, *,
                 elsewhere: bool = False) -> None:
        self._token = token
        self._action = action
        self._elsewhere = elsewhere  # on RELAY_ADMIN_PORT: this port only says so
        self._refused = BoundedLog("admin_refused")

    def moved(self) -> AdminApi:
        """What the HTTP port answers for /admin/... while the API is on its own port."""
        return AdminApi(self._token, self._action, elsewhere=True)

    @property
    def on(self) -> bool:
        """A token is set and the API answers here."""
        return self._token is not None and not self._elsewhere

    @staticmethod
    def mine(path: str) -> bool:
        """The request is for the admin API."""
        route = urlsplit(path).path
        return route.startswith(PREFIX) or route == "/admin"

    async def handle(self, method: str, path: str, headers: Mapping[str, str],
                     body: bytes) -> Response:
        """Answer one request; log what it did."""
        status, reply, did = await self._answer(method, path, headers, body)
        fields = {"method": method, "path": urlsplit(path).path, "status": status, "did": did}
        if status < 400:
            log.info("admin_call", **fields)
        else:
            self._refused(**fields)
        return reply

    async def _answer(self, method: str, path: str, headers: Mapping[str, str],
                      body: bytes) -> tuple[int, Response, str]:
        if self._elsewhere:
            return 404, _reply(404, {"error": "the admin API listens on its own port "
                                              "(RELAY_ADMIN_PORT), not this one"}), ""
        if self._token is None:
            return 404, _reply(404, {"error": "the admin API is off: set RELAY_ADMIN_TOKEN"}), ""
        if not self._authorised(headers):
            return 401, _reply(401, {"error": "a valid `Authorization: Bearer <token>` header "
                                              "is needed"}), "no valid token"
        return await self._route(method, path, headers, body)

    async def _route(self, method: str, path: str, headers: Mapping[str, str],
                     body: bytes) -> tuple[int, Response, str]:
        parts = urlsplit(path)
        route = parts.path.rstrip("/")
        if method == "GET" and route == "/admin/dead":
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            return await self._call("list", {"limit": query.get("limit", "100"),
                                             "reason": query.get("reason")})
        if method == "GET" and route.startswith("/admin/dead/"):
            return await self._call("show", {"id": unquote(route.rsplit("/", 1)[1])})
        if method == "POST" and route in {"/admin/dead/replay", "/admin/dead/purge"}:
            return await self._change(route.rsplit("/", 1)[1], headers, body)
        if route in {"/admin/dead", "/admin/dead/replay", "/admin/dead/purge"} or \
                route.startswith("/admin/dead/"):
            return 405, _reply(405, {"error": f"{method} is not allowed here"}), ""
        return 404, _reply(404, {"error": "no such admin call: GET /admin/dead, GET "
                                          "/admin/dead/<id>, POST /admin/dead/replay, POST "
                                          "/admin/dead/purge"}), ""

    def _authorised(self, headers: Mapping[str, str]) -> bool:
        given = headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or self._token is None:
            return False
        return hmac.compare_digest(token.strip().encode(), self._token.encode())

    async def _change(self, action: str, headers: Mapping[str, str],
                      body: bytes) -> tuple[int, Response, str]:
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != JSON:
            return 415, _reply(415, {"error": "send a JSON body (Content-Type: "
                                              "application/json)"}), ""
        try:
            args = json.loads(body or b"{}")
        except ValueError as exc:
            return 400, _reply(400, {"error": f"the body is not JSON: {exc}"}), ""
        if not isinstance(args, dict) or set(args) - _FILTER_KEYS:
            return 400, _reply(400, {"error": "the body is an object of: "
                                              + ", ".join(sorted(_FILTER_KEYS))}), ""
        return await self._call(action, args)

    async def _call(self, action: str, args: dict[str, Any]) -> tuple[int, Response, str]:
        try:
            result = await self._action(action, args)
        except DatabaseError as exc:
            return 503, _reply(503, {"error": f"the database is unavailable: {exc}"}), action
        except RelayError as exc:
            return 400, _reply(400, {"error": str(exc)}), action
        if action == "show" and not result:
            return 404, _reply(404, {"error": f"no dead letter with id {args['id']}"}), action
        return 200, _reply(200, result), _summary(action, args, result)


def _summary(action: str, args: dict[str, Any], result: Any) -> str:
    """What a call did, for its log line (ids are not repeated there)."""
    if action == "replay" and isinstance(result, dict) and "replayed" in result:
        return f"replayed {len(result['replayed'])}, left {len(result.get('left', []))}"
    if action == "purge" and isinstance(result, dict) and "purged" in result:
        return f"purged {result['purged']}"
    if isinstance(result, dict) and "would" in result:
        return f"{action} dry run: {result['would']}"
    if action == "list":
        return f"listed {len(result)}"
    return f"{action} {args.get('id', '')}".strip()
