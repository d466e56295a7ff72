"""The bulk frame encoder matches pamqp byte for byte; the tag tracker settles ranges exactly."""

from __future__ import annotations

from datetime import UTC, datetime

from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from relay.amqp.encoder import amqp_properties
from relay.amqp.frames import Confirm, ConfirmTracker, FrameEncoder
from relay.interfaces import Message
from relay.options import Properties


def _reference(m: Message, channel: int, frame_max: int) -> bytes:
    parts = [
        pamqp_frame.marshal(
            spec.Basic.Publish(exchange=m.exchange, routing_key=m.routing_key,
                               mandatory=m.mandatory), channel),
        pamqp_frame.marshal(ContentHeader(body_size=len(m.body),
                                          properties=amqp_properties(m)), channel),
    ]
    step = frame_max - 8
    parts += [pamqp_frame.marshal(ContentBody(m.body[i:i + step]), channel)
              for i in range(0, len(m.body), step)]
    return b"".join(parts)


def test_encode__matches_pamqp_for_every_property_shape() -> None:
    shared = Properties()
    rich = Properties(content_type="text/plain", headers={"a": 1, "b": "x"}, priority=5,
                      correlation_id="c", expiration="1000", type="t", app_id="app",
                      timestamp=datetime(2024, 1, 2, tzinfo=UTC), delivery_mode=1)
    override = Properties(message_id="producer-id")
    own_id = Properties(message_id="0b0c5a8e-0000-4000-8000-000000000005")
    forged = Properties(headers={"x-outbox-id": "0b0c5a8e-0000-4000-8000-000000000001",
                                 "z": "0b0c5a8e-0000-4000-8000-000000000006"},
                        message_id="0b0c5a8e-0000-4000-8000-000000000001")
    messages = [
        Message("0b0c5a8e-0000-4000-8000-000000000001", "x", "rk", b'{"n":1}', shared, True),
        Message("0b0c5a8e-0000-4000-8000-000000000002", "x", "rk", b'{"n":2}', shared, True),
        Message("0b0c5a8e-0000-4000-8000-000000000003", "", "q", b"[]", rich, False),
        Message("0b0c5a8e-0000-4000-8000-000000000004", "y", "k2", b"1" * 300, override, True),
        # The producer's messageId is the row's own id (this once made a malformed frame).
        Message("0b0c5a8e-0000-4000-8000-000000000005", "x", "rk", b"{}", own_id, True),
        # A producer's value of the relay's header, and another row's id as messageId.
        Message("0b0c5a8e-0000-4000-8000-000000000006", "x", "rk", b"{}", forged, True),
        Message("short-id", "x", "rk", b"{}", shared, True),
        Message("ünicode-id", "x", "rk", b"{}", shared, True),
    ]
    encoder = FrameEncoder(7, 128, amqp_properties)
    expected = b"".join(_reference(m, 7, 128) for m in messages)
    for m in messages:  # every message carries its own row id in the relay's header
        assert amqp_properties(m).headers["x-outbox-id"] == m.id
    assert encoder.encode(messages) == expected
    assert encoder.encode(messages) == expected  # from the caches this time


def test_tracker__multiple_ack_settles_every_pending_tag_up_to_it_across_batches() -> None:
    tracker = ConfirmTracker()
    done: list[str] = []
    a = tracker.add(["a1", "a2", "a3"], lambda: done.append("a"))
    b = tracker.add(["b1", "b2"], lambda: done.append("b"))
    tracker.on_confirm(2, False, Confirm.NACKED)
    tracker.on_confirm(4, True, Confirm.ACKED)
    assert list(a.status) == [Confirm.ACKED, Confirm.NACKED, Confirm.ACKED]
    assert list(b.status) == [Confirm.ACKED, Confirm.PENDING]
    assert done == ["a"]
    tracker.on_confirm(5, False, Confirm.ACKED)
    assert done == ["a", "b"]
    assert not tracker.ranges


def test_tracker__closed_channel_leaves_unconfirmed_tags_pending() -> None:
    tracker = ConfirmTracker()
    done: list[str] = []
    a = tracker.add(["a1", "a2"], lambda: done.append("a"))
    tracker.on_confirm(1, False, Confirm.ACKED)
    tracker.abandon_all()
    assert done == ["a"]
    assert list(a.status) == [Confirm.ACKED, Confirm.PENDING]


def test_encode_chunks__whole_frames_in_pieces_that_join_to_the_one_write() -> None:
    """A batch goes to the writer in pieces of about a megabyte, never as one more copy of
    all its bodies; each piece is whole frames (other channels may write between pieces)."""
    shared = Properties()
    messages = [Message(f"0b0c5a8e-0000-4000-8000-{i:012d}", "x", "rk",
                        b"y" * (300_000 if i % 3 == 0 else 50), shared, True) for i in range(12)]
    encoder = FrameEncoder(3, 131072, amqp_properties)
    pieces = list(encoder.encode_chunks(messages, chunk_bytes=200_000))
    chunks = [p.payload for p in pieces]
    assert b"".join(chunks) == b"".join(_reference(m, 3, 131072) for m in messages)
    assert sum(p.ended for p in pieces) == len(messages)
    # A piece ends inside a message only when that message is larger than a piece.
    ended = 0
    for piece in pieces:
        ended += piece.ended
        if not piece.whole:
            assert len(messages[ended].body) > 200_000
    assert pieces[-1].whole
    assert len(chunks) >= 5
    for chunk in chunks:  # every piece parses as whole frames
        offset = 0
        while offset < len(chunk):
            size = int.from_bytes(chunk[offset + 3:offset + 7], "big")
            assert chunk[offset + 7 + size] == 0xCE
            offset += 8 + size
        assert offset == len(chunk)
    assert max(len(c) for c in chunks) < 200_000 + 131072


def test_bounded_cache__weights_never_exceed_the_budget_and_heavy_entries_are_not_kept() -> None:
    from relay.caches import BoundedCache

    cache: BoundedCache[int, str] = BoundedCache(10_000, max_entry_bytes=3_000)
    for i in range(1000):
        cache.put(i, "v", 700)
        assert cache.weight <= 10_000
    cache.put(-1, "heavy", 5_000)
    assert cache.get(-1) is None
    assert cache.get(999) == "v"


def test_encode__a_property_set_met_once_is_encoded_once() -> None:
    """Rows whose options all differ (a traceparent each) cost one encoding per row; a set
    that comes again gets its template (two encodings, once) and is spliced from then on."""
    calls = []

    def counting(m: Message) -> spec.Basic.Properties:
        calls.append(m.id)
        return amqp_properties(m)

    unique = [Message(f"0b0c5a8e-0000-4000-8000-00000000010{i}", "x", "rk", b"{}",
                      Properties(headers={"traceparent": f"00-{i:032x}-{i:016x}-01"}), True)
              for i in range(5)]
    encoder = FrameEncoder(1, 4096, counting)
    assert encoder.encode(unique) == b"".join(_reference(m, 1, 4096) for m in unique)
    assert len(calls) == len(unique)
    shared = Properties(content_type="application/json")
    repeated = [Message(f"0b0c5a8e-0000-4000-8000-00000000020{i}", "x", "rk", b"{}", shared, True)
                for i in range(5)]
    calls.clear()
    assert encoder.encode(repeated) == b"".join(_reference(m, 1, 4096) for m in repeated)
    assert len(calls) == 1 + 2  # the first in full, then the template's two stand-ins


def test_trim__a_batch_cut_between_writes_keeps_its_written_tags_and_gives_back_the_rest() -> None:
    """A pass that stopped writing at its deadline: the tags of what went out keep their
    confirms, the rest are not sent, and the next batch's tags follow the written ones."""
    tracker = ConfirmTracker()
    done: list[str] = []
    a = tracker.add(["a1", "a2", "a3", "a4"], lambda: done.append("a"))
    tracker.on_confirm(1, False, Confirm.ACKED)
    tracker.trim(a, 2)
    assert tracker.next_tag == 3
    b = tracker.add(["b1"], lambda: done.append("b"))
    assert b.first == 3
    tracker.on_confirm(3, True, Confirm.ACKED)  # multiple: a's tag 2 and b's tag 3
    assert list(a.status) == [Confirm.ACKED, Confirm.ACKED, Confirm.NOT_SENT, Confirm.NOT_SENT]
    assert list(b.status) == [Confirm.ACKED]
    assert done == ["a", "b"]


def test_trim__a_batch_whose_written_part_was_confirmed_already_is_done() -> None:
    tracker = ConfirmTracker()
    done: list[str] = []
    a = tracker.add(["a1", "a2", "a3"], lambda: done.append("a"))
    tracker.on_confirm(1, False, Confirm.ACKED)
    tracker.trim(a, 1)
    assert done == ["a"]
    assert not tracker.ranges


def test_property_cache__charges_what_it_keeps_alive_for_rows_with_large_unique_headers() -> None:
    """Each entry of the encoder's property cache keeps its whole property set alive; charged
    256 bytes each, rows with ~20 KB of unique headers could hold ~330 MB. Charged by the
    options' size, the cache keeps at most its budget's worth."""
    import json

    from relay.options import parse_options

    encoder = FrameEncoder(1, 131072, amqp_properties)
    for i in range(2000):
        options = json.dumps({"headers": {"n": i, "pad": "h" * 20_000}})
        m = Message(f"0b0c5a8e-0000-4000-8000-{i:012d}", "x", "rk", b"{}",
                    parse_options(options), True)
        encoder.header_frame(m)
    kept = len(encoder._props)
    assert kept * 20_000 <= encoder._props.max_bytes, f"{kept} property sets of 20 KB kept"
