"""Row options -> AMQP properties, without servers."""

from __future__ import annotations

import pytest

from relay.errors import InvalidRow
from relay.options import PERSISTENT, TRANSIENT, parse_options


def test_parse_options__no_options_means_json_and_persistent() -> None:
    for text in (None, "null", "{}"):
        props = parse_options(text)
        assert props.content_type == "application/json"
        assert props.delivery_mode == PERSISTENT


@pytest.mark.parametrize(
    ("text", "attr", "expected"),
    [
        ('{"contentType": "text/plain"}', "content_type", "text/plain"),
        ('{"content_type": "text/plain"}', "content_type", "text/plain"),
        ('{"persistent": false}', "delivery_mode", TRANSIENT),
        ('{"deliveryMode": 1}', "delivery_mode", TRANSIENT),
        ('{"delivery_mode": 2}', "delivery_mode", PERSISTENT),
        ('{"deliveryMode": true}', "delivery_mode", PERSISTENT),
        ('{"expiration": 1500}', "expiration", "1500"),
        ('{"expiration": "1500"}', "expiration", "1500"),
        ('{"correlationId": "c"}', "correlation_id", "c"),
        ('{"reply_to": "r"}', "reply_to", "r"),
        ('{"headers": {"a": 1}}', "headers", {"a": 1}),
        ('{"priority": 9}', "priority", 9),
        ('{"appId": "x", "userId": "guest"}', "app_id", "x"),
        ('{"messageId": "biz-1"}', "message_id", "biz-1"),
        ('{"mandatory": false}', "mandatory", False),
    ],
)
def test_parse_options__maps_camel_and_snake_case(text: str, attr: str, expected: object) -> None:
    assert getattr(parse_options(text), attr) == expected


def test_parse_options__persistent_wins_over_delivery_mode() -> None:
    assert parse_options('{"persistent": true, "deliveryMode": 1}').delivery_mode == PERSISTENT


def test_parse_options__timestamp_is_seconds_since_epoch() -> None:
    props = parse_options('{"timestamp": 1700000000}')
    assert props.timestamp is not None
    assert int(props.timestamp.timestamp()) == 1_700_000_000


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"colour": "red"}', "options.colour: unknown option"),
        ('{"priority": "high"}', "options.priority"),
        ('{"priority": 300}', "options.priority"),
        ('{"expiration": "soon"}', "options.expiration"),
        ('{"deliveryMode": 3}', "options.deliveryMode"),
        ('{"headers": [1, 2]}', "options.headers"),
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_parse_options__rejects_bad_options_naming_the_field(text: str, names: str) -> None:
    with pytest.raises(InvalidRow) as exc:
        parse_options(text)
    assert names in str(exc.value)
