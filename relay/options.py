"""Row `options` -> AMQP message properties. Accepts amqplib's camelCase and snake_case names."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from relay.caches import BoundedCache
from relay.errors import InvalidRow

DEFAULT_CONTENT_TYPE = "application/json"
PERSISTENT = 2
TRANSIENT = 1
# RabbitMQ reads `expiration` with Erlang's string:to_integer on the raw bytes: an optional
# sign, then ASCII digits only, nothing after them; it refuses a negative value and one above
# ten years (its MAX_EXPIRY_TIMER, 315,360,000,000 ms, measured on the broker: larger values
# close the channel with PRECONDITION_FAILED). `str.isdigit()` would also accept Arabic-Indic
# or full-width digits, which the broker refuses.
MAX_EXPIRATION_MS = 315_360_000_000
_EXPIRATION = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)
MILLISECONDS_FROM = 100_000_000_000  # a timestamp this large is milliseconds, not seconds
MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z, the last second datetime holds


class PublishOptions(BaseModel):
    """The publish options a row may carry; any other name is rejected."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    content_type: str | None = Field(default=None, alias="contentType", max_length=255)
    content_encoding: str | None = Field(default=None, alias="contentEncoding", max_length=255)
    persistent: bool | None = None
    delivery_mode: bool | Literal[1, 2] | None = Field(default=None, alias="deliveryMode")
    headers: dict[str, Any] | None = None
    priority: int | None = Field(default=None, ge=0, le=255)
    correlation_id: str | None = Field(default=None, alias="correlationId", max_length=255)
    reply_to: str | None = Field(default=None, alias="replyTo", max_length=255)
    expiration: str | int | None = None
    message_id: str | None = Field(default=None, alias="messageId", max_length=255)
    timestamp: int | float | str | None = None
    type: str | None = Field(default=None, max_length=255)
    user_id: str | None = Field(default=None, alias="userId", max_length=255)
    app_id: str | None = Field(default=None, alias="appId", max_length=255)
    mandatory: bool | None = None

    @field_validator("expiration", mode="before")
    @classmethod
    def _expiration_ms(cls, value: object) -> str | None:
        if value is None:
            return None
        text = str(value)
        if isinstance(value, bool) or not isinstance(value, str | int) \
                or not _EXPIRATION.match(text):
            raise ValueError("must be a non-negative number of milliseconds in ASCII digits")
        if int(text) < 0:
            raise ValueError("must be a non-negative number of milliseconds")
        if int(text) > MAX_EXPIRATION_MS:
            raise ValueError(f"must be at most {MAX_EXPIRATION_MS} milliseconds (RabbitMQ)")
        return text

    @field_validator("timestamp", mode="before")
    @classmethod
    def _timestamp_s(cls, value: object) -> int | None:
        return None if value is None else timestamp_seconds(value)


def timestamp_seconds(value: object) -> int:
    """Seconds since the epoch from seconds, milliseconds (amqplib's Date.now()) or ISO 8601.

    A number from 1e11 up is read as milliseconds: as seconds it would be past the year 5000.
    """
    if isinstance(value, bool):
        raise ValueError("must be seconds or milliseconds since the epoch, or ISO 8601 text")
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("text must be an ISO 8601 date and time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        seconds = parsed.timestamp()
    elif isinstance(value, int | float):
        seconds = float(value)
        if seconds >= MILLISECONDS_FROM:
            seconds /= 1000.0
    else:
        raise ValueError("must be seconds or milliseconds since the epoch, or ISO 8601 text")
    if not 0 <= seconds <= MAX_TIMESTAMP_S:
        raise ValueError("must fall between 1970 and the year 9999")
    return int(seconds)


@dataclass(frozen=True, slots=True)
class Properties:
    """AMQP basic properties for one row, independent of the client library."""

    content_type: str = DEFAULT_CONTENT_TYPE
    content_encoding: str | None = None
    delivery_mode: int = PERSISTENT
    headers: dict[str, Any] | None = field(default=None, hash=False)
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: datetime | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    mandatory: bool | None = None
    # Characters of the options text it came from: what a cache that keeps this object alive
    # charges for it (its headers can be large), relay/amqp/frames.py.
    source_chars: int = field(default=0, compare=False)


def _delivery_mode(opts: PublishOptions) -> int:
    if opts.persistent is not None:
        return PERSISTENT if opts.persistent else TRANSIENT
    if opts.delivery_mode is None:
        return PERSISTENT
    if isinstance(opts.delivery_mode, bool):
        return PERSISTENT if opts.delivery_mode else TRANSIENT
    return opts.delivery_mode


def _reason(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "options"
    if first["type"] == "extra_forbidden":
        return f"options.{where}: unknown option"
    return f"options.{where}: {first['msg']}"


# Parsed options by their text, at most 4 MiB in all (a text and its headers are charged
# about four times the text's length); a text over 64 KiB is parsed every time.
_PARSED: BoundedCache[str, Properties] = BoundedCache(4 << 20, max_entry_bytes=256 << 10)


def parse_options(text: str | None) -> Properties:
    """Validate a row's options JSON text; raise InvalidRow naming the offending field.

    Cached by text: rows of one producer usually share their options verbatim.
    """
    if text is None or text == "null":
        return _NO_OPTIONS
    cached = _PARSED.get(text)
    if cached is None:
        cached = _parse(text)
        _PARSED.put(text, cached, 4 * len(text) + 512)
    return cached


def _parse(text: str) -> Properties:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidRow(f"options: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise InvalidRow("options: must be a JSON object")
    try:
        opts = PublishOptions.model_validate(raw)
    except ValidationError as exc:
        raise InvalidRow(_reason(exc)) from None
    return Properties(
        content_type=opts.content_type or DEFAULT_CONTENT_TYPE,
        content_encoding=opts.content_encoding,
        delivery_mode=_delivery_mode(opts),
        headers=opts.headers,
        priority=opts.priority,
        correlation_id=opts.correlation_id,
        reply_to=opts.reply_to,
        expiration=None if opts.expiration is None else str(opts.expiration),
        message_id=opts.message_id,
        timestamp=None
        if opts.timestamp is None
        else datetime.fromtimestamp(int(opts.timestamp), tz=UTC),
        type=opts.type,
        user_id=opts.user_id,
        app_id=opts.app_id,
        mandatory=opts.mandatory,
        source_chars=len(text),
    )


_NO_OPTIONS = Properties()
