"""Valid means encodable: what AMQP or RabbitMQ would refuse is refused before sending, with a
reason naming the field; what the relay accepts liberally is converted. No servers."""

from __future__ import annotations

import json
import struct

import pytest
from pamqp import commands as spec

from relay.amqp.encoder import Encoder, amqp_properties, returned_row_id
from relay.interfaces import Fault, Message, OutboxRow, Reason

ROW_ID = "0b0c5a8e-0000-4000-8000-000000000001"


def _row(**kw: object) -> OutboxRow:
    base: dict[str, object] = {
        "id": ROW_ID, "exchange": "x", "routing_key": "rk", "content": '{"a": 1}',
        "options": None, "attempts": 0,
    }
    base.update(kw)
    return OutboxRow(**base)  # type: ignore[arg-type]


def _options(**opts: object) -> OutboxRow:
    return _row(options=json.dumps(opts))


def _fault(row: OutboxRow, encoder: Encoder | None = None) -> Fault:
    built = (encoder or Encoder()).build(row)
    assert isinstance(built, Fault), f"expected a refusal, got {built!r}"
    return built


def _message(row: OutboxRow) -> Message:
    built = Encoder().build(row)
    assert isinstance(built, Message), f"expected a message, got {built!r}"
    return built


def test_build__null_content_and_exchange_are_invalid_rows_not_a_crash() -> None:
    assert _fault(_row(content=None)) == Fault(Reason.INVALID_ROW, _fault(_row(content=None)).text)
    assert _fault(_row(content=None)).text.startswith("content: NULL")
    assert _fault(_row(exchange=None)).text.startswith("exchange: NULL")


def test_build__null_routing_key_means_the_empty_key() -> None:
    assert _message(_row(routing_key=None)).routing_key == ""


def test_build__oversize_body_names_the_limit_and_the_setting() -> None:
    fault = _fault(_row(content='"' + "x" * 200 + '"'), Encoder(max_message_bytes=100))
    assert fault.reason is Reason.TOO_LARGE
    assert "202 bytes exceeds" in fault.text
    assert "RELAY_MAX_MESSAGE_BYTES" in fault.text


def test_build__invalid_options_name_the_field() -> None:
    assert _fault(_row(options='{"priority": "high"}')).text.startswith("options.priority:")
    assert _fault(_row(options='{"bogus": 1}')) == Fault(Reason.INVALID_OPTION,
                                                          "options.bogus: unknown option")


@pytest.mark.parametrize(
    ("options", "seconds"),
    [
        ({"timestamp": 1763900000000}, 1763900000),  # amqplib's Date.now(): milliseconds
        ({"timestamp": 1763900000}, 1763900000),
        ({"timestamp": 1763900000.75}, 1763900000),
        ({"timestamp": "2025-11-23T12:13:20Z"}, 1763900000),
        ({"timestamp": "2025-11-23T12:13:20"}, 1763900000),  # no zone: UTC
    ],
)
def test_build__timestamps_in_seconds_milliseconds_or_iso_text_are_accepted(
    options: dict[str, object], seconds: int
) -> None:
    stamp = _message(_options(**options)).properties.timestamp
    assert stamp is not None
    assert int(stamp.timestamp()) == seconds


@pytest.mark.parametrize("value", [-1, 10**20, True, "next tuesday", [1], 1e400])
def test_build__impossible_timestamps_are_refused_naming_the_option(value: object) -> None:
    fault = _fault(_row(options=json.dumps({"timestamp": value})))
    assert fault.reason is Reason.INVALID_OPTION
    assert fault.text.startswith("options.timestamp")


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (_row(routing_key="k" * 300), "routing_key: 300 bytes"),
        (_row(routing_key="ü" * 128), "routing_key: 256 bytes"),
        (_row(exchange="x" * 300), "exchange: 300 bytes"),
        (_row(exchange="tab\there"), "exchange: 'tab\\there' is not a valid AMQP exchange name"),
        (_row(exchange="ünï"), "exchange: 'ünï' is not a valid AMQP exchange name"),
        (_row(exchange="x" * 128), "is not a valid AMQP exchange name"),
        (_options(contentType="é" * 200), "options.contentType: 400 bytes"),
        (_options(messageId="m" * 256), "options.messageId"),
        (_options(headers={"k" * 129: 1}), "options.headers: a key of 129 bytes"),
        (_options(headers={"n": 2**64}), "options.headers.n: integer out of the 64-bit range"),
        (_options(headers={"CC": "queue-a"}), "options.headers.CC: must be an array of strings"),
        (_options(headers={"BCC": [1]}), "options.headers.BCC: must be an array of strings"),
        (_options(headers={"big": "x" * 140_000}), "over the broker's frame size"),
        (_options(expiration=10**13), "options.expiration"),
    ],
)
def test_build__what_amqp_or_rabbitmq_refuses_is_dead_naming_the_field(
    row: OutboxRow, field: str
) -> None:
    fault = _fault(row)
    assert fault.reason in (Reason.ENCODE_ERROR, Reason.TOO_LARGE, Reason.INVALID_OPTION)
    assert field in fault.text


def test_build__deep_nesting_is_refused_not_a_recursion_crash() -> None:
    deep: object = 1
    for _ in range(80):
        deep = {"a": deep}
    assert "nested deeper than" in _fault(_options(headers={"d": deep})).text
    text = '{"headers": {"d": ' + "[" * 5000 + "]" * 5000 + "}}"
    assert _fault(_row(options=text)).reason is Reason.INVALID_OPTION


def test_build__a_foreign_user_id_is_forbidden() -> None:
    fault = _fault(_options(userId="mallory"), Encoder(broker_user="guest"))
    assert fault.reason is Reason.FORBIDDEN
    assert "'mallory' is not the relay's broker user 'guest'" in fault.text


def test_build__header_values_of_every_json_type_within_amqp_ranges_are_accepted() -> None:
    headers = {"s": "t", "i": -(2**63), "u": 2**63 - 1, "f": 1.5, "b": False, "n": None,
               "a": [1, "x", [None, {"k": 2}]], "t": {"nested": {"deeper": [1.25]}},
               "CC": ["q1", "q2"]}
    props = amqp_properties(_message(_options(headers=headers)))
    assert props.marshal()
    assert props.headers is not None
    assert props.headers["i"] == -(2**63)


def test_properties__the_relays_header_is_the_row_id_whatever_the_producer_wrote() -> None:
    other = "0b0c5a8e-0000-4000-8000-0000000000ff"
    m = _message(_options(headers={"x-outbox-id": other}, messageId=other))
    props = amqp_properties(m)
    assert props.headers is not None
    assert props.headers["x-outbox-id"] == ROW_ID
    assert props.message_id == other  # the producer's messageId is kept
    assert returned_row_id(props) == ROW_ID


def test_properties__message_id_is_the_row_id_unless_the_producer_chose_one() -> None:
    assert amqp_properties(_message(_row())).message_id == ROW_ID
    assert amqp_properties(_message(_options(messageId=ROW_ID))).message_id == ROW_ID


@pytest.mark.parametrize("value", ["٥٠٠", "１５００", "1500 ", " 1500", "0x10", "15.0", "+", "-5",
                                   "315360000001"])
def test_build__expiration_the_broker_would_refuse_is_an_invalid_option(value: str) -> None:
    """RabbitMQ reads expiration as an optional sign and ASCII digits, 0..10 years in ms
    (non-ASCII digits passed str.isdigit() and closed the channel with 406)."""
    fault = _fault(_options(expiration=value))
    assert fault.reason is Reason.INVALID_OPTION
    assert "options.expiration" in fault.text


@pytest.mark.parametrize("value", ["0", "1500", "+5", "-0", "0042", "315360000000", 1500])
def test_build__expiration_the_broker_accepts_is_sent_as_written(value: object) -> None:
    assert _message(_options(expiration=value)).properties.expiration == str(value)


def test_properties__header_floats_are_encoded_as_doubles_keeping_their_value() -> None:
    message = _message(_options(headers={"f": 12345678.9, "tiny": 1e-300, "big": 1e300,
                                         "nested": {"list": [0.1]}}))
    encoded = amqp_properties(message).marshal()
    decoded = spec.Basic.Properties()
    decoded.unmarshal(int.from_bytes(encoded[:2], "big"), encoded[2:])
    headers = decoded.headers
    assert headers["f"] == 12345678.9
    assert headers["tiny"] == 1e-300
    assert headers["big"] == 1e300
    assert headers["nested"]["list"] == [0.1]
    assert b"d" + struct.pack(">d", 12345678.9) in encoded


def test_a_recurring_occurrence__carries_its_time_beside_the_row_id_options_untouched() -> None:
    options = json.dumps({"headers": {"tenant": "t1"}})
    plain = _message(_row(options=options))
    recurring = _message(_row(options=options, repeat="PT1S", occurrence_s=1_790_000_000.25))
    props = amqp_properties(recurring)
    assert props.message_id == ROW_ID
    assert props.headers == {"tenant": "t1", "x-outbox-id": ROW_ID,
                             "x-outbox-occurrence": "2026-09-21T14:13:20.250Z"}
    # The parsed options are cached and shared by every row with the same text: untouched.
    assert plain.properties.headers == {"tenant": "t1"}
    assert _message(_row(options=options)).properties.headers == {"tenant": "t1"}
