"""Wire encoding of a whole batch of publishes, and settlement of its delivery tags.

Pure code (no I/O) so that it can be checked byte for byte against pamqp in unit tests.
aiormq encodes every publish through pamqp objects (about 3x what the broker needs per
message); here the Basic.Publish method frame is cached per (exchange, routing key,
mandatory), the content-header properties are packed once per property set with only the row
id spliced in per row (length-preserving, so no length prefix changes), and the batch is
written in pieces of about a megabyte of whole frames. The bytes are those pamqp writes for the
same message.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.header import ContentHeader

from relay.caches import BoundedCache
from relay.interfaces import Message
from relay.options import Properties

FRAME_END = b"\xce"
_FRAME_OVERHEAD = 8  # type(1) channel(2) size(4) ... end(1)
_HEADER_START = struct.Struct(">BHIHHQ")  # frame type, channel, size, class, weight, body size
_BODY_START = struct.Struct(">BHI")



class Confirm(IntEnum):
    """What the broker said about one message of a pass (a byte of a TagRange's status)."""

    PENDING = 0  # written, no confirm yet
    ACKED = 1
    NACKED = 2
    TIMEOUT = 3  # no confirm by the deadline on an open channel: late, its fate unknown
    LOST = 4  # the channel or the connection closed before a confirm: its fate unknown
    NOT_SENT = 5  # the pass stopped writing before this message (its tag given back)

# A batch goes to the connection's writer in pieces of about this size, each awaited (drained)
# before the next: memory holds one piece, not a copy of the whole batch.
CHUNK_BYTES = 1 << 20

PropertiesFor = Callable[[Message], spec.Basic.Properties]
# A property set met once so far: no template yet (FrameEncoder._template).
_SEEN_ONCE: list[bytes] = []
MethodFor = Callable[[str, str, bool], spec.Basic.Publish]


# The broker confirmed the message, either way.
HEARD = (Confirm.ACKED, Confirm.NACKED)
# The members as module names: a lookup on the enum class costs several times a plain name,
# and these are compared once per message or tag.
_PENDING, _NOT_SENT = Confirm.PENDING, Confirm.NOT_SENT


def _slots(a: bytes, b: bytes, n: int) -> list[bytes] | None:
    """Split `a` around the places where it differs from `b` in runs of exactly `n` bytes."""
    if len(a) != len(b) or n == 0:
        return None
    diffs = [i for i in range(len(a)) if a[i] != b[i]]
    if not diffs or len(diffs) % n:
        return None
    parts, prev = [], 0
    for k in range(0, len(diffs), n):
        start = diffs[k]
        if diffs[k + n - 1] != start + n - 1:
            return None
        parts.append(a[prev:start])
        prev = start + n
    parts.append(a[prev:])
    return parts


class FrameEncoder:
    """Encodes batches of publishes for one channel number into one bytes object."""

    def __init__(self, channel_number: int, frame_max: int, properties_for: PropertiesFor,
                 method_for: MethodFor | None = None) -> None:
        self.channel = channel_number
        self.max_body_frame = frame_max - _FRAME_OVERHEAD
        self._properties_for = properties_for
        self._method_for = method_for or (
            lambda x, k, m: spec.Basic.Publish(exchange=x, routing_key=k, mandatory=m)
        )
        # Both bounded by bytes (relay/caches.py): producers choose destinations and headers.
        self._methods: BoundedCache[tuple[str, str, bool], bytes] = BoundedCache(2 << 20)
        # (id(Properties), id length) -> (the object, kept alive so its id is not reused;
        # the encoded properties split where the row id goes, or None: encode in full)
        self._props: BoundedCache[tuple[int, int], tuple[Properties, list[bytes] | None]] = (
            BoundedCache(4 << 20))

    def method_frame(self, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        """The Basic.Publish frame, encoded once per destination."""
        key = (exchange, routing_key, mandatory)
        cached = self._methods.get(key)
        if cached is None:
            cached = pamqp_frame.marshal(self._method_for(exchange, routing_key, mandatory),
                                         self.channel)
            self._methods.put(key, cached, len(cached) + 100)
        return cached

    def _template(self, message: Message, id_size: int) -> list[bytes] | None:
        """The encoded properties of the message's property set, split where the row id goes;
        None the first time a property set is seen (encode that message in full).

        Encoded twice with two stand-in ids of the row id's length: the bytes that differ are
        exactly the row id's places (message_id, the relay's header), and no length prefix
        changes when the real id is spliced in, since it has the same length. A template costs
        two encodings and a comparison, so it is made only when a property set comes again:
        rows whose options are all different (a traceparent each) are encoded once per row.
        """
        p = message.properties
        key = (id(p), id_size)
        entry = self._props.get(key)
        if entry is None or entry[0] is not p:
            # The entry keeps the whole property set alive: charge for it (about 4 bytes of
            # parsed objects per character of its options text), not for the key alone.
            self._props.put(key, (p, _SEEN_ONCE), 4 * p.source_chars + 256)
            return None
        if entry[1] is not _SEEN_ONCE:
            return entry[1]
        encoded = [
            self._properties_for(
                Message(stand_in * id_size, message.exchange, message.routing_key, b"", p, False)
            ).marshal()
            for stand_in in ("a", "b")
        ]
        parts = _slots(encoded[0], encoded[1], id_size)
        self._props.put(key, (p, parts), 3 * len(encoded[0]) + 4 * p.source_chars + 256)
        return parts

    def header_frame(self, message: Message) -> bytes:
        """The content header frame of one message."""
        mid = message.id.encode()
        parts = self._template(message, len(mid))
        if parts is None:
            header = ContentHeader(
                body_size=len(message.body), properties=self._properties_for(message)
            )
            return pamqp_frame.marshal(header, self.channel)
        props = mid.join(parts)
        start = _HEADER_START.pack(2, self.channel, 12 + len(props), 60, 0, len(message.body))
        return b"".join((start, props, FRAME_END))

    def _body_frames(self, body: bytes) -> Iterator[bytes]:
        """Each content body frame on its own (a large body is never copied whole at once)."""
        if len(body) <= self.max_body_frame:
            yield b"".join((_BODY_START.pack(3, self.channel, len(body)), body, FRAME_END))
            return
        view, step = memoryview(body), self.max_body_frame
        for i in range(0, len(body), step):
            piece = view[i : i + step]
            yield b"".join((_BODY_START.pack(3, self.channel, len(piece)), piece, FRAME_END))

    def encode(self, messages: Sequence[Message]) -> bytes:
        """Method, header and body frames of every message, in order, as one write."""
        return b"".join(c.payload for c in self.encode_chunks(messages, chunk_bytes=None))

    def encode_chunks(self, messages: Sequence[Message],
                      chunk_bytes: int | None = CHUNK_BYTES) -> Iterator[Chunk]:
        """The same frames in writes of about `chunk_bytes` (whole frames each, in order), so
        a batch of large messages is never one more copy of all its bodies in memory.

        A message no larger than `chunk_bytes` is never split between two writes, so a pass
        that must stop writing (its deadline) can stop between writes with every message
        either wholly written or not at all; only a larger message is split, frame by frame."""
        parts: list[bytes] = []
        size = ended = 0
        for m in messages:
            frames = [self.method_frame(m.exchange, m.routing_key, m.mandatory),
                      self.header_frame(m)]
            large = chunk_bytes is not None and len(m.body) > chunk_bytes
            for frame in itertools.chain(frames, self._body_frames(m.body) if m.body else ()):
                parts.append(frame)
                size += len(frame)
                if large and chunk_bytes is not None and size >= chunk_bytes:
                    yield Chunk(b"".join(parts), ended, whole=False)
                    parts, size, ended = [], 0, 0
            ended += 1
            if chunk_bytes is not None and size >= chunk_bytes:
                yield Chunk(b"".join(parts), ended, whole=True)
                parts, size, ended = [], 0, 0
        if parts:
            yield Chunk(b"".join(parts), ended, whole=True)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One write of a pass: its frames, how many messages end in it, and whether it ends
    where a message ends (the writer may stop after it without a message cut in two)."""

    payload: bytes
    ended: int
    whole: bool


@dataclass(eq=False, slots=True)
class TagRange:
    """The delivery tags of one batch on one channel and what the broker said of each."""

    first: int
    ids: list[str]
    on_done: Callable[[], None]
    status: bytearray = field(init=False)
    low: int = field(init=False)
    remaining: int = field(init=False)

    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.status = bytearray(len(self.ids))
        self.low = self.first
        self.remaining = self.count = len(self.ids)

    @property
    def last(self) -> int:
        """The highest delivery tag of the batch."""
        return self.first + self.count - 1

    def trim(self, written: int) -> None:
        """Only the first `written` messages went out: the others never get a tag."""
        for i in range(written, self.count):
            if self.status[i] == _PENDING:
                self.status[i] = _NOT_SENT
                self.remaining -= 1
        self.count = written

    def settle_upto(self, tag: int, code: int) -> None:
        """A multiple ack/nack: every still-pending tag <= `tag` gets `code`."""
        hi = min(tag, self.last)
        if hi < self.low:
            return
        a, b = self.low - self.first, hi - self.first + 1
        pending = self.status.count(_PENDING, a, b)
        if pending == b - a:
            self.status[a:b] = bytes((code,)) * (b - a)
        elif pending:
            for i in range(a, b):
                if self.status[i] == _PENDING:
                    self.status[i] = code
        self.remaining -= pending
        self.low = hi + 1

    def settle_one(self, tag: int, code: int) -> None:
        """A single ack/nack."""
        i = tag - self.first
        if 0 <= i < self.count and self.status[i] == _PENDING:
            self.status[i] = code
            self.remaining -= 1


class ConfirmTracker:
    """Delivery tags of one confirm channel: assigns them, settles them from acks and nacks.

    The broker numbers publishes on a channel 1, 2, 3, ... in the order it reads them, so a
    batch written as one contiguous write owns a contiguous range of tags.
    """

    def __init__(self) -> None:
        self.next_tag = 1
        self.ranges: deque[TagRange] = deque()
        self.heard_at = 0.0  # loop time of the channel's last ack or nack

    def add(self, ids: list[str], on_done: Callable[[], None]) -> TagRange:
        """Reserve tags for a batch about to be written (in write order)."""
        r = TagRange(self.next_tag, ids, on_done)
        self.next_tag += len(ids)
        self.ranges.append(r)
        return r

    def trim(self, r: TagRange, written: int) -> None:
        """The newest batch stopped after `written` messages: the next batch's tags follow
        them; a batch whose written messages were all confirmed already is done."""
        r.trim(written)
        self.next_tag = r.first + written
        if r.remaining == 0 and r in self.ranges:
            self.ranges.remove(r)
            r.on_done()

    def discard(self, r: TagRange) -> None:
        """Stop tracking a batch (timed out); later confirms for its tags are ignored."""
        with contextlib.suppress(ValueError):
            self.ranges.remove(r)

    def on_confirm(self, tag: int, multiple: bool, code: int) -> None:
        """Apply one basic.ack / basic.nack frame."""
        finished: list[TagRange] = []
        for r in self.ranges:
            if r.first > tag:
                break
            if multiple:
                r.settle_upto(tag, code)
            elif tag <= r.last:
                r.settle_one(tag, code)
            if r.remaining == 0:
                finished.append(r)
        for r in finished:
            self.ranges.remove(r)
            r.on_done()

    def abandon_all(self) -> None:
        """The channel closed: every pending tag's fate is unknown."""
        ranges, self.ranges = list(self.ranges), deque()
        for r in ranges:
            r.on_done()
