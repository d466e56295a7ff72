"""Rows that can never be published are recognised before any publish, with a reason."""

from __future__ import annotations

from relay.interfaces import OutboxRow
from relay.loop.worker import build_messages


def _row(**kw: object) -> OutboxRow:
    base: dict[str, object] = {
        "id": "00000000-0000-0000-0000-000000000001", "exchange": "x", "routing_key": "rk",
        "content": '{"a": 1}', "options": None, "attempts": 0,
    }
    base.update(kw)
    return OutboxRow(**base)  # type: ignore[arg-type]


def test_build_messages__null_content_and_exchange_are_invalid_not_a_crash() -> None:
    rows = [_row(id="a", content=None), _row(id="b", exchange=None), _row(id="c")]
    messages, invalid = build_messages(rows, mandatory=True, max_message_bytes=100)
    assert [m.id for m in messages] == ["c"]
    assert invalid["a"].startswith("content: NULL")
    assert invalid["b"].startswith("exchange: NULL")


def test_build_messages__null_routing_key_means_the_empty_key() -> None:
    messages, invalid = build_messages([_row(routing_key=None)], mandatory=True,
                                       max_message_bytes=100)
    assert not invalid
    assert messages[0].routing_key == ""


def test_build_messages__oversize_body_names_the_limit_and_the_setting() -> None:
    _, invalid = build_messages([_row(content='"' + "x" * 200 + '"')], mandatory=True,
                                max_message_bytes=100)
    reason = next(iter(invalid.values()))
    assert "202 bytes exceeds" in reason
    assert "RELAY_MAX_MESSAGE_BYTES" in reason


def test_build_messages__invalid_options_name_the_field() -> None:
    rows = [_row(id="a", options='{"priority": "high"}'), _row(id="b", options='{"bogus": 1}')]
    _, invalid = build_messages(rows, mandatory=True, max_message_bytes=100)
    assert invalid["a"].startswith("options.priority:")
    assert invalid["b"] == "options.bogus: unknown option"
