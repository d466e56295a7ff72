"""One named stream producer per slot, over RabbitMQ's stream protocol (rstream).

The producer's name is the slot's (`<table>-<slot>`): the broker keeps, per name and stream, the
highest publishing id it stored and drops a message at or below it. Messages are sent with the
publishing ids the database gave them, one AMQP 1.0 message per row (never a sub-entry batch,
which would turn deduplication off), carrying the row id as message-id and in the application
property `x-outbox-id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rstream import AMQPMessage, ConfirmationStatus, Producer, Properties, schema
from rstream.exceptions import (
    AccessRefused,
    LeaderNotAvailable,
    PreconditionFailed,
    PublisherDoesNotExist,
    ServerError,
    StreamDoesNotExist,
    StreamNotAvailable,
)

from relay.errors import BrokerError
from relay.streams import wire  # noqa: F401 - the client's string encoding, fixed on import

OUTBOX_ID_PROPERTY = "x-outbox-id"
# A publish frame's own bytes, and each message's beside its encoded data (the stream protocol's
# Publish: size, key, version, publisher id, count; publishing id, length).
PUBLISH_FRAME_OVERHEAD = 13
MESSAGE_OVERHEAD = 12
# What the relay asks for at the connection's tuning: the broker answers with the lower of this
# and its own `stream.frame_max` (1 MiB by default), so raising that setting is enough.
ASKED_FRAME_MAX = 256 * 1024 * 1024
# Our AMQP 1.0 message's properties (message id, content type, x-outbox-id) take far less than
# this: a row whose body is shorter is never checked further.
PROPERTIES_MARGIN = 1024


@dataclass(frozen=True)
class StreamServer:
    """Where the stream protocol listens, and as whom."""

    host: str
    port: int
    username: str
    password: str
    vhost: str = "/"


@dataclass(frozen=True)
class Outgoing:
    """One row to send."""

    id: str
    body: bytes
    publishing_id: int


@dataclass
class SendResult:
    """What the broker said of a send: rows confirmed (stored now, or before: a duplicate is
    confirmed too), rows refused, rows not answered within the deadline."""

    confirmed: list[str]
    refused: list[str]
    unanswered: list[str]


class StreamLinkSilent(BrokerError):
    """The broker answered nothing on this slot's connection for SILENT_SENDS sends in a row:
    the link is given up (a silent cut), and the slot starts again on a new one."""


# Sends in a row that the broker did not answer at all before the slot gives its connection
# up; each waits the confirm timeout (StreamConfig.confirm_timeout_s, 10 s).
SILENT_SENDS = 2
# How long opening the slot's connection (TCP, TLS, the stream protocol's handshake) may take,
# and closing it: over a silent link the client waits 5 s for each goodbye of each of its
# connections (the locator's, each leader's) before it drops the socket.
CONNECT_TIMEOUT_S = 10.0
# The stream an idle slot asks the broker about (SlotProducer.check); it need not exist.
LINK_CHECK_STREAM = "outbox-relay-link-check"
CLOSE_TIMEOUT_S = 15.0


# The stream protocol's response codes that answer a publisher sequence query.
RESPONSE_OK = 1
RESPONSE_STREAM_DOES_NOT_EXIST = 2


class StreamGone(BrokerError):
    """The stream cannot take messages now: it does not exist, has no leader (RabbitMQ 3.10
    "creates" a stream whose name is too long for its data directory and never starts it),
    or this user may not write to it. Rows for it wait until it can."""


# What the broker says of one stream, not of the connection: the slot goes on with the others.
# PublisherDoesNotExist: rstream 1.1's clean-up after a refused publisher declaration deletes
# the publisher the broker never made, and that error replaces the refusal (its context).
_STREAM_REFUSALS = (StreamDoesNotExist, StreamNotAvailable, LeaderNotAvailable, AccessRefused,
                    PreconditionFailed, PublisherDoesNotExist)


def _refusal(exc: BaseException) -> BaseException:
    """The broker's own answer behind `exc` (the refusal a failed clean-up replaced)."""
    context = exc.__context__
    if isinstance(exc, PublisherDoesNotExist) and isinstance(context, ServerError):
        return context
    return exc


def _message(row: Outgoing) -> AMQPMessage:
    message = AMQPMessage(body=row.body,
                          properties=Properties(message_id=row.id,
                                                content_type="application/json"),
                          application_properties={OUTBOX_ID_PROPERTY: row.id})
    # A tuple underneath: the id the database gave is set after construction.
    message.publishing_id = row.publishing_id
    return message


class _Producer(Producer):
    """rstream's producer with its first (locator) connection kept open for its whole life.

    The client closes that connection each time it opens one to a new stream's leader, and its
    close waits 200 ms: each slot's first message to each stream waited for it, so after a
    start or takeover a slot serving 100 streams stalled 20 s. The slot asks the locator for
    its last stored ids (takeover) anyway; closing the producer closes every connection.
    tests/unit/test_stream_wire.py checks that the client still closes it there."""

    async def _close_locator_connection(self) -> None:
        return None

    async def _maybe_clean_up_during_lost_connection(self, publisher_id: int) -> None:
        """The client's clean-up after a publisher declaration failed (the stream refused it,
        or the connection broke) first sleeps 0-2 s at random, then asks the broker to delete
        the publisher it never made: each try of a refusing stream stalled its slot's other
        streams that long. The slot drops the whole client after either (SlotProducer.
        start_afresh, or the slot's close), so here the publisher is only forgotten.
        tests/unit/test_stream_wire.py checks that the client still calls it there."""
        self._publishers.pop(publisher_id, None)

    def forget_publishers_of(self, stream: str | None) -> None:
        """Drop the client's publishers of `stream` (None: all) without asking the broker to
        delete them: the broker does not know them (a declaration it refused, one it dropped)
        or cannot hear (a silent link), and the client's close would wait 5 s for each, or log
        each failed deletion as an error with its traceback. tests/unit/test_stream_wire.py
        checks the client's publisher table."""
        for publisher_id, publisher in list(self._publishers.items()):
            if stream is None or publisher.stream == stream:
                del self._publishers[publisher_id]


class SlotProducer:
    """The named producer of one slot, on a connection of its own (and a locator's)."""

    def __init__(self, server: StreamServer, name: str, *,
                 frame_max: int = ASKED_FRAME_MAX) -> None:
        self.name = name
        self.frame_max = 0  # known once started
        self.silent_sends = 0  # sends in a row the broker did not answer at all
        self.heard_at = time.monotonic()  # when the broker last answered on this connection
        self.synced: set[str] = set()
        self._server = server
        self._asked_frame_max = frame_max
        self._producer = self._client()

    def _client(self) -> _Producer:
        server = self._server
        return _Producer(server.host, server.port, username=server.username,
                         password=server.password, vhost=server.vhost,
                         frame_max=self._asked_frame_max,
                         connection_name=f"outbox-relay {self.name}")

    async def start(self) -> None:
        """Connect (within CONNECT_TIMEOUT_S: TimeoutError), and note the frame_max the broker
        agreed to."""
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await self._producer.start()
            self.frame_max = int((await self._producer.default_client).frame_max)
        self.silent_sends = 0  # a new connection
        self.heard_at = time.monotonic()
        # Streams whose mark the slot asked the broker for on this connection (worker._sync):
        # asked again on each new one.
        self.synced.clear()

    async def start_afresh(self, stream: str) -> None:
        """A new client after a stream refused its publisher or messages: rstream may keep a
        publisher the broker does not know (one whose declaration was refused, when its own
        clean-up failed; one the broker dropped), and every later message to that stream would
        be refused one by one. Publishers are declared again at each stream's next message,
        under the same name: the broker's deduplication holds."""
        self._producer.forget_publishers_of(stream)
        with contextlib.suppress(Exception):
            await self.close()
        self._producer = self._client()
        await self.start()

    async def close(self) -> None:
        """Close the connection (unconfirmed messages stay the database's rows), within
        CLOSE_TIMEOUT_S. After SILENT_SENDS unanswered sends the publishers are not deleted
        one by one first: nothing would answer."""
        if self.silent_sends >= SILENT_SENDS:
            self._producer.forget_publishers_of(None)
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await self._producer.close()

    def too_large(self, rows: Sequence[Outgoing]) -> tuple[list[tuple[Outgoing, int]], int]:
        """The rows whose message alone would not fit in one publish frame of this connection,
        each with its frame's size; and the connection's frame_max (0: the broker set none)."""
        limit = self.frame_max
        fixed = PUBLISH_FRAME_OVERHEAD + MESSAGE_OVERHEAD
        out: list[tuple[Outgoing, int]] = []
        if limit <= 0:
            return out, limit
        for row in rows:
            if len(row.body) + fixed + PROPERTIES_MARGIN > limit:
                size = fixed + len(bytes(_message(row)))
                if size > limit:
                    out.append((row, size))
        return out, limit

    async def check(self, timeout_s: float) -> None:
        """Ask the broker something (a stream's metadata) on the slot's first connection:
        StreamLinkSilent when no answer comes within `timeout_s`. Any answer, a stream missing
        included, is one."""
        client = await self._producer.default_client
        try:
            await asyncio.wait_for(client.stream_exists(LINK_CHECK_STREAM), timeout_s)
        except TimeoutError:
            self.silent_sends = SILENT_SENDS  # nothing to say goodbye to either
            raise StreamLinkSilent(f"no answer from the broker to a check within {timeout_s:g} s "
                                   "while the slot was idle: the stream connection is given "
                                   "up") from None
        self.silent_sends = 0
        self.heard_at = time.monotonic()

    async def last_stored(self, stream: str, name: str | None = None) -> int:
        """The highest publishing id the broker stored for this producer name (or `name`) in
        `stream`: 0 when none, or when the stream does not exist (a stream's marks live in the
        stream: one made again starts with none). StreamGone when the broker cannot tell (no
        leader, this user may not use the stream): ids given without it might be at or below
        it. The client's own query returns 0 for any refusal."""
        client = await self._producer.default_client
        answer = await client.sync_request(
            schema.QueryPublisherSequence(client._corr_id_seq.next(),
                                          publisher_ref=name or self.name, stream=stream),
            resp_schema=schema.QueryPublisherSequenceResponse, raise_exception=False)
        self.heard_at = time.monotonic()
        if answer.response_code == RESPONSE_OK:
            return int(answer.sequence)
        if answer.response_code == RESPONSE_STREAM_DOES_NOT_EXIST:
            return 0
        raise StreamGone(f"stream {stream!r}: the broker cannot tell the last publishing id it "
                         f"stored (response code {answer.response_code})")

    async def send(self, stream: str, rows: Sequence[Outgoing], timeout_s: float) -> SendResult:
        """Publish `rows` (ascending publishing ids) and wait for every answer, at most
        `timeout_s`."""
        by_id = {r.publishing_id: r.id for r in rows}
        answers: dict[int, bool] = {}
        done = asyncio.get_running_loop().create_future()

        async def on_confirm(status: ConfirmationStatus) -> None:
            answers[status.message_id] = status.is_confirmed
            if len(answers) >= len(by_id) and not done.done():
                done.set_result(None)

        messages = [_message(r) for r in rows]
        try:
            await self._producer.send_batch(stream, messages, publisher_name=self.name,
                                            on_publish_confirm=on_confirm)
        except _STREAM_REFUSALS as exc:
            refusal = _refusal(exc)
            await self.start_afresh(stream)
            raise StreamGone(f"stream {stream!r} cannot take messages: "
                             f"{type(refusal).__name__} {refusal}".rstrip()) from exc
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), timeout_s)
        self.silent_sends = 0 if answers else self.silent_sends + 1
        if answers:
            self.heard_at = time.monotonic()
        return SendResult(
            confirmed=[by_id[p] for p, ok in answers.items() if ok and p in by_id],
            refused=[by_id[p] for p, ok in answers.items() if not ok and p in by_id],
            unanswered=[i for p, i in by_id.items() if p not in answers])
