"""The admin API's routing and checks (relay/ops/admin.py), pure: whatever a client sends, the
answer is a status with a JSON body, never an exception; only an authorised, well-formed call
reaches an action, and a filter's values are checked before any database is asked."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.ops.admin import AdminApi, BoundedLog
from relay.pg.deadletters import _filter_of

TOKEN = "t" * 32
AUTH = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


class Actions:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, action: str, args: dict[str, Any]) -> Any:
        if action in {"replay", "purge"}:
            _filter_of(args)  # the real checks of a filter's values (UsageError: 400)
        self.calls.append((action, args))
        return {"would": 0} if action in {"replay", "purge"} else [{"id": "x"}]


def _ask(api: AdminApi, method: str, path: str, headers: dict[str, str],
         body: bytes) -> tuple[int, Any]:
    status, ctype, raw = asyncio.run(api.handle(method, path, headers, body))
    assert ctype == "application/json"
    return status, json.loads(raw)


def test_off__every_call_answers_404_saying_how_to_turn_it_on() -> None:
    actions = Actions()
    status, body = _ask(AdminApi(None, actions), "POST", "/admin/dead/purge", AUTH,
                        b'{"all": true}')
    assert status == 404
    assert "RELAY_ADMIN_TOKEN" in body["error"]
    assert actions.calls == []


def test_moved__the_http_port_says_the_api_is_on_its_own_port_and_calls_nothing() -> None:
    actions = Actions()
    api = AdminApi(TOKEN, actions)
    assert api.on
    assert not api.moved().on
    status, body = _ask(api.moved(), "GET", "/admin/dead", AUTH, b"")
    assert status == 404
    assert "RELAY_ADMIN_PORT" in body["error"]
    assert actions.calls == []


def test_bounded_log__at_most_the_burst_in_a_window_then_says_how_many_it_held_back() -> None:
    now = [0.0]
    refused = BoundedLog("admin_refused", burst=3, window_s=60.0, clock=lambda: now[0])
    written = [refused(status=401) for _ in range(10)]
    assert written == [True] * 3 + [False] * 7
    assert refused.suppressed == 7
    now[0] = 59.0  # the first three are still in the window
    assert not refused(status=401)
    now[0] = 60.5  # they left it: one line, which carries the count held back
    assert refused(status=401)
    assert refused.suppressed == 0


def test_a_token_that_differs_in_its_last_character_is_refused() -> None:
    actions = Actions()
    status, _ = _ask(AdminApi(TOKEN, actions), "GET", "/admin/dead",
                     {"authorization": "Bearer " + "t" * 31 + "u"}, b"")
    assert status == 401
    assert actions.calls == []


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["ids", "reason", "older_than", "all",
                                                        "limit", "dry_run", "other"]),
                                       inner, max_size=4),
                     max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"]),
       path=st.sampled_from(["/admin", "/admin/", "/admin/dead", "/admin/dead/replay",
                             "/admin/dead/purge", "/admin/dead/%2e%2e", "/admin/x?y=1",
                             "/admin/dead?limit=abc"]),
       token=st.sampled_from([TOKEN, None, "", "Bearer", "x" * 32]),
       body=_json, raw=st.one_of(st.none(), st.binary(max_size=20)))
def test_any_request__a_json_answer_and_only_authorised_calls_reach_an_action(
    method: str, path: str, token: str | None, body: Any, raw: bytes | None,
) -> None:
    actions = Actions()
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    payload = raw if raw is not None else json.dumps(body).encode()
    status, answer = _ask(AdminApi(TOKEN, actions), method, path, headers, payload)
    assert status in {200, 400, 401, 404, 405, 415}
    if token != TOKEN:
        assert status == 401
        assert actions.calls == []
    if status >= 400:
        assert isinstance(answer["error"], str)
