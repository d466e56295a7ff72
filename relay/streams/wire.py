"""A fix of the stream client's wire encoding (rstream 1.1.1, pinned below 1.2).

rstream writes a protocol string's length as its number of characters, where the stream
protocol wants its number of UTF-8 bytes: any stream or producer name outside ASCII corrupts
the frame, and the broker closes the connection ("unknown frame"), or waits for bytes that never
come. A stream row for such a stream would fail its slot at every try and hold the slot's later
rows behind it. Imported by relay/streams/producer.py, this replaces the string case of the
client's field encoder with one that counts bytes, and only when the client still counts
characters (a fixed release is left as it is); tests/unit/test_stream_wire.py checks both.
"""

from __future__ import annotations

from typing import Any

from rstream import encoding
from rstream.constants import T

_original = encoding._encode_field


def _counts_characters() -> bool:
    return bytes(_original("é", T.string))[:2] == (1).to_bytes(2, "big")


def _encode_field(value: Any, tp: Any) -> bytes | bytearray:
    if tp is T.string and isinstance(value, str):
        data = value.encode("utf-8")
        return len(data).to_bytes(2, "big", signed=False) + data
    return _original(value, tp)


if _counts_characters():
    encoding._encode_field = _encode_field
