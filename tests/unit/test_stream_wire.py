"""The stream client's strings on the wire: a length in UTF-8 bytes, then the bytes (the stream
protocol's rule). rstream 1.1.1 counts characters; relay/streams/wire.py fixes that on import.
A later client that encodes strings another way fails here, not in production."""

from __future__ import annotations

import pytest
from rstream import encoding, schema
from rstream.constants import T

import relay.streams.wire  # noqa: F401 - the fix under test


@pytest.mark.parametrize("text", ["plain", "é", "日本-stream", "\u202e", "😀" * 60, ""])
def test_a_string_field__is_its_utf8_byte_length_then_its_bytes(text: str) -> None:
    data = text.encode()
    assert bytes(encoding._encode_field(text, T.string)) == len(data).to_bytes(2, "big") + data


def test_a_whole_frame_with_a_name_outside_ascii__decodes_to_the_same_frame() -> None:
    frame = schema.QueryPublisherSequence(correlation_id=7, publisher_ref="queue_message-é",
                                          stream="commandes-été")
    encoded = encoding.encode_frame(frame)
    assert int.from_bytes(encoded[:4], "big") == len(encoded) - 4
    decoded = encoding.decode_frame(encoded[4:])
    assert decoded == frame
