"""Where the relay reaches into the stream client (rstream), checked against the pinned client:

- strings on the wire: a length in UTF-8 bytes, then the bytes (the stream protocol's rule).
  rstream 1.1.1 counts characters; relay/streams/wire.py fixes that on import. A later client
  that encodes strings another way fails here, not in production.
- the locator connection: the client closes it (a 200 ms wait) when it opens a new stream's
  connection, through the method relay/streams/producer.py overrides to keep it open.
- the publisher table: the relay drops a refused stream's publishers from it before closing
  the client (whose close would ask the broker to delete each, and log an error for one the
  broker never knew)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

import pytest
from rstream import Producer, encoding, schema
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


def test_the_client_closes_its_locator_connection_through_the_method_the_relay_overrides() -> None:
    from relay.streams.producer import _Producer

    opens_a_stream = inspect.getsource(Producer._get_or_create_client)
    assert "await self._close_locator_connection()" in opens_a_stream
    closes = inspect.getsource(Producer._close_locator_connection)
    assert ".close()" in closes
    assert _Producer._close_locator_connection is not Producer._close_locator_connection


async def test_a_failed_publisher_declaration_is_cleaned_up_through_the_method_the_relay_overrides(
) -> None:
    """rstream's own clean-up sleeps 0-2 s at random first: the relay's forgets at once."""
    from rstream.producer import _Publisher

    from relay.streams.producer import _Producer

    declares = inspect.getsource(Producer._get_or_create_publisher)
    assert declares.count("await self._maybe_clean_up_during_lost_connection(publisher_id)") == 2
    assert "sleep(randrange" in inspect.getsource(Producer._maybe_clean_up_during_lost_connection)
    producer = _Producer("127.0.0.1", username="u", password="p")
    producer._publishers[3] = _Publisher(id=3, reference="r", stream="s", sequence=None,
                                         client=None)  # type: ignore[arg-type]
    async with asyncio.timeout(0.1):
        await producer._maybe_clean_up_during_lost_connection(3)
        await producer._maybe_clean_up_during_lost_connection(7)  # never made: nothing to do
    assert producer._publishers == {}


def test_the_client_keeps_its_publishers_by_id_with_their_stream__which_the_relay_drops_from(
) -> None:
    from rstream.producer import _Publisher

    from relay.streams.producer import _Producer

    producer = _Producer("127.0.0.1", username="u", password="p")
    assert producer._publishers == {}
    assert "stream" in {f.name for f in dataclasses.fields(_Publisher)}
    producer._publishers[3] = _Publisher(id=3, reference="r", stream="s", sequence=None,
                                         client=None)  # type: ignore[arg-type]
    producer._publishers[4] = _Publisher(id=4, reference="r", stream="t", sequence=None,
                                         client=None)  # type: ignore[arg-type]
    producer.forget_publishers_of("s")
    assert list(producer._publishers) == [4]
    closes = inspect.getsource(Producer.close)
    assert "self._publishers" in closes, "the client's close no longer reads its publishers"
