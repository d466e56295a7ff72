"""A row's wire form: built, and refused when AMQP or RabbitMQ would refuse it, before sending.

Both transports write exactly what `amqp_properties` and `publish_method` return, so a row that
gets through `Encoder.build` is one the broker can parse: valid means encodable. What the broker
would refuse at the protocol level (a short string over 255 bytes, an exchange name outside
AMQP's rule, a header value of no AMQP type, properties larger than a frame, a foreign user_id)
comes back as a Fault naming the field, and its row is dead at once: sending it would close the
channel or, for a frame the broker cannot parse, the whole connection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pamqp import commands as spec

from relay.caches import BoundedCache
from relay.errors import InvalidRow
from relay.interfaces import Fault, Message, OutboxRow, Reason
from relay.options import Properties, parse_options

OUTBOX_ID_HEADER = "x-outbox-id"
# A recurring row's occurrence: the time it was due, ISO 8601 UTC (docs/recurring.md). Every
# occurrence carries the row's id; (id, occurrence) tells one occurrence from the next.
OCCURRENCE_HEADER = "x-outbox-occurrence"
SHORTSTR_MAX = 255
TABLE_KEY_MAX = 128  # pamqp silently truncates longer field names
HEADER_DEPTH_MAX = 64
DEFAULT_FRAME_MAX = 131072
_INT64 = (-(2**63), 2**63 - 1)
_FRAME_OVERHEAD = 8
_HEADER_FIXED = 14  # class id, weight, body size, property flags
_SENDER_SELECTED = ("CC", "BCC")  # RabbitMQ closes the channel unless these are string arrays
_STRING_PROPERTIES = (
    ("content_type", "contentType"), ("content_encoding", "contentEncoding"),
    ("correlation_id", "correlationId"), ("reply_to", "replyTo"), ("expiration", "expiration"),
    ("message_id", "messageId"), ("type", "type"), ("user_id", "userId"), ("app_id", "appId"),
)


def amqp_properties(message: Message) -> spec.Basic.Properties:
    """pamqp properties of a message: the row id always in the relay's own header (any value a
    producer put there is overwritten), and as message_id unless the producer chose one."""
    p: Properties = message.properties
    headers = dict(p.headers) if p.headers else {}
    headers[OUTBOX_ID_HEADER] = message.id
    return spec.Basic.Properties(
        content_type=p.content_type,
        content_encoding=p.content_encoding,
        headers=headers,
        delivery_mode=p.delivery_mode,
        priority=p.priority,
        correlation_id=p.correlation_id,
        reply_to=p.reply_to,
        expiration=p.expiration,
        message_id=p.message_id or message.id,
        timestamp=p.timestamp,
        message_type=p.type,
        user_id=p.user_id,
        app_id=p.app_id,
    )


def with_occurrence(props: Properties, occurrence_s: float) -> Properties:
    """The row's properties with its occurrence header (a copy: parsed options are shared)."""
    when = datetime.fromtimestamp(occurrence_s, UTC).isoformat(timespec="milliseconds")
    headers = {**(props.headers or {}), OCCURRENCE_HEADER: when.replace("+00:00", "Z")}
    return replace(props, headers=headers)


def publish_method(exchange: str, routing_key: str, mandatory: bool) -> spec.Basic.Publish:
    """The basic.publish method (pamqp checks the exchange name against AMQP's rule here)."""
    return spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)


def returned_row_id(properties: spec.Basic.Properties) -> str | None:
    """The row a basic.return belongs to: only the relay's own header says (never message_id,
    which a producer may set to anything, including another row's id)."""
    value = (properties.headers or {}).get(OUTBOX_ID_HEADER)
    return None if value is None else str(value)


@dataclass(slots=True)
class Encoder:
    """Builds rows into messages with the limits of one broker connection."""

    mandatory: bool = True
    max_message_bytes: int = 16 * 1024 * 1024
    frame_max: int = DEFAULT_FRAME_MAX
    broker_user: str | None = None  # RabbitMQ refuses any other user_id
    # Bounded by bytes (relay/caches.py): producers choose exchanges, keys and headers.
    _routes: BoundedCache[tuple[str, str, bool], tuple[Fault | None]] = field(
        default_factory=lambda: BoundedCache(2 << 20), repr=False)
    # (id(Properties), id length) -> (the object, kept alive so its id is not reused; verdict)
    _props: BoundedCache[tuple[int, int], tuple[Properties, Fault | None]] = field(
        default_factory=lambda: BoundedCache(4 << 20), repr=False)

    def build(self, row: OutboxRow) -> Message | Fault:
        """The row's message, or the reason it can never be published as it is."""
        body = self._body(row)
        if isinstance(body, Fault):
            return body
        try:
            props = parse_options(row.options)
        except InvalidRow as exc:
            return Fault(Reason.INVALID_OPTION, str(exc))
        if row.occurrence_s is not None:
            props = with_occurrence(props, row.occurrence_s)
        mandatory = self.mandatory if props.mandatory is None else props.mandatory
        # A NULL routing key (classic tables allow it) means the empty key, as in amqplib.
        message = Message(row.id, row.exchange or "", row.routing_key or "", body, props,
                          mandatory)
        fault = self.check(message)
        if fault is not None:
            return fault
        message.checked = True
        return message

    def _body(self, row: OutboxRow) -> bytes | Fault:
        """The row's body, or why it has none to send: content the claim left in the database
        or over the limit (too large), a NULL body or exchange (a table of the classic shape
        allows them)."""
        if row.withheld is not None:
            return self._too_large(row.withheld, " (the content stayed in the database)")
        if row.content is None:
            return Fault(Reason.INVALID_ROW, "content: NULL (a message needs a body; insert "
                         "JSON, e.g. 'null'::jsonb)")
        if row.exchange is None:
            return Fault(Reason.INVALID_ROW, "exchange: NULL (use '' for the default exchange)")
        # The store hands UTF-8 bytes (no copy); a str (tests, tools) is encoded.
        body = row.content if isinstance(row.content, bytes) else row.content.encode()
        if len(body) > self.max_message_bytes:
            return self._too_large(len(body))
        return body

    def _too_large(self, size: int, where: str = "") -> Fault:
        return Fault(Reason.TOO_LARGE, f"content: {size} bytes exceeds the maximum message "
                     f"size ({self.max_message_bytes} bytes, RELAY_MAX_MESSAGE_BYTES){where}")

    def check(self, message: Message) -> Fault | None:
        """Why the broker would refuse this message's method or header frame, if it would.

        Cached per destination and per property set (rows of one producer share both), so a
        batch pays pamqp's encoding once per kind of row, not once per row.
        """
        route = (message.exchange, message.routing_key, message.mandatory)
        routed = self._routes.get(route)
        if routed is None:
            fault = _check_route(message)
            routed = (fault,)
            self._routes.put(route, routed, len(route[0]) + len(route[1]) + 200)
        if routed[0] is not None:
            return routed[0]
        p = message.properties
        key = (id(p), len(message.id.encode()))
        cached = self._props.get(key)
        if cached is None or cached[0] is not p:
            fault, size = self._check_properties(message)
            cached = (p, fault)
            # About what the entry keeps alive: the property set's strings and headers.
            self._props.put(key, cached, 2 * size + 256)
        return cached[1]

    def _check_properties(self, message: Message) -> tuple[Fault | None, int]:
        """Why the broker would refuse the message's properties, and their encoded size."""
        fault = _check_properties(message.properties, self.broker_user)
        if fault is not None:
            return fault, 0
        try:
            size = len(amqp_properties(message).marshal()) + _HEADER_FIXED + _FRAME_OVERHEAD
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            return Fault(Reason.ENCODE_ERROR, f"options: AMQP cannot encode them ({exc})"), 0
        if size > self.frame_max:
            return Fault(Reason.TOO_LARGE, f"options: the properties and headers encode to "
                         f"{size} bytes, over the broker's frame size ({self.frame_max} bytes)"
                         ), size
        return None, size


def _check_route(message: Message) -> Fault | None:
    for name, value in (("routing_key", message.routing_key), ("exchange", message.exchange)):
        size = len(value.encode())
        if size > SHORTSTR_MAX:
            return Fault(Reason.ENCODE_ERROR, f"{name}: {size} bytes, AMQP allows at most "
                         f"{SHORTSTR_MAX}")
    try:
        publish_method(message.exchange, message.routing_key, message.mandatory).marshal()
    except (TypeError, ValueError) as exc:
        return Fault(Reason.ENCODE_ERROR, f"exchange: {message.exchange[:80]!r} is not a valid "
                     "AMQP exchange name (letters, digits, space and -_.:@#,/+, at most 127 "
                     f"characters: {exc})")
    return None


def _check_properties(p: Properties, broker_user: str | None) -> Fault | None:
    for attr, option in _STRING_PROPERTIES:
        value = getattr(p, attr)
        if value is not None and len(value.encode()) > SHORTSTR_MAX:
            return Fault(Reason.ENCODE_ERROR, f"options.{option}: {len(value.encode())} bytes, "
                         f"AMQP allows at most {SHORTSTR_MAX}")
    if p.user_id is not None and broker_user is not None and p.user_id != broker_user:
        return Fault(Reason.FORBIDDEN, f"options.userId: {p.user_id!r} is not the relay's broker "
                     f"user {broker_user!r} (RabbitMQ refuses it)")
    if p.headers:
        problem = _check_table(p.headers, "options.headers", 1)
        if problem is not None:
            return Fault(Reason.ENCODE_ERROR, problem)
        for name in _SENDER_SELECTED:
            value = p.headers.get(name)
            if value is not None and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                return Fault(Reason.ENCODE_ERROR, f"options.headers.{name}: must be an array of "
                             "strings (RabbitMQ's sender-selected distribution)")
    return None


def _check_table(table: dict[str, Any], where: str, depth: int) -> str | None:
    for key, value in table.items():
        if len(key.encode()) > TABLE_KEY_MAX:
            return f"{where}: a key of {len(key.encode())} bytes, AMQP allows {TABLE_KEY_MAX}"
        problem = _check_value(value, f"{where}.{key[:40]}", depth)
        if problem is not None:
            return problem
    return None


def _check_value(value: Any, where: str, depth: int) -> str | None:
    if depth > HEADER_DEPTH_MAX:
        return f"{where}: nested deeper than {HEADER_DEPTH_MAX} levels"
    if isinstance(value, dict):
        return _check_table(value, where, depth + 1)
    if isinstance(value, list):
        problems = (_check_value(item, f"{where}[]", depth + 1) for item in value)
        return next((p for p in problems if p is not None), None)
    return _check_scalar(value, where)


def _check_scalar(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, int):
        ok = _INT64[0] <= value <= _INT64[1]
        return None if ok else f"{where}: integer out of the 64-bit range AMQP tables carry"
    if isinstance(value, float):
        # Written as a double (relay/amqp/compat.py); JSON from PostgreSQL is always finite.
        ok = math.isfinite(value)
        return None if ok else f"{where}: a number AMQP tables cannot carry ({value})"
    return f"{where}: {type(value).__name__} has no AMQP table type"
