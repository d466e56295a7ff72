"""The publish pipeline's pass loop over a scripted transport (no broker): which verdict each
kind of broker answer gives, for either transport, since both sit behind the same seam."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pamqp import commands as spec

from relay.amqp.connection import ExchangeCache
from relay.amqp.encoder import amqp_properties
from relay.amqp.frames import Confirm, ConfirmTracker, FrameEncoder
from relay.amqp.pipeline import Pipeline
from relay.amqp.transports import Bulk, Sent, _Closing, _ConfirmChannel
from relay.interfaces import Message, Reason
from relay.supervise import Supervisor
from tests.kit.fakes import msg

ACK = Confirm.ACKED


@dataclass
class FakeConnection:
    connected: bool = True
    blocked: bool = False
    missing: set[str] = field(default_factory=set)
    abandoned: list[str] = field(default_factory=list)
    supervisor: Supervisor = field(default_factory=lambda: Supervisor("broker"))
    exchanges: ExchangeCache = field(default_factory=ExchangeCache)
    user: str = "guest"
    raw: Any = None
    answering: bool = False  # a check on the connection is answered (the broker is alive)

    @property
    def ready(self) -> bool:
        return self.connected and not self.blocked

    def on_open(self, callback: Any) -> None:
        pass

    async def missing_exchanges(self, names: set[str]) -> set[str]:
        return names & self.missing

    async def answers(self, timeout_s: float) -> bool:
        return self.answering

    async def abandon(self, why: str) -> None:
        self.abandoned.append(why)
        self.connected = False


Answer = Callable[[Sequence[Message]], Sent]


@dataclass
class ScriptedTransport:
    """Answers each send with the next scripted answer; records what was sent."""

    answers: list[Answer]
    sends: list[list[str]] = field(default_factory=list)
    usable: bool = True
    opened: int = 0

    async def open(self, connection: Any) -> None:
        self.opened += 1
        self.usable = True

    async def discard(self) -> None:
        self.usable = False

    async def send(self, messages: Sequence[Message], deadline: float) -> Sent:
        self.sends.append([m.id for m in messages])
        sent = (self.answers.pop(0)(messages) if self.answers
                else Sent([Confirm.ACKED] * len(messages)))
        if sent.closed_by_broker is not None:
            self.usable = False
        return sent


def _pipeline(conn: FakeConnection, *answers: Answer) -> tuple[Pipeline, ScriptedTransport]:
    transport = ScriptedTransport(list(answers))
    return Pipeline(conn, transport, publish_timeout_s=15), transport  # type: ignore[arg-type]


BATCH = [msg(f"m{i}") for i in range(5)]


async def test_publish__acks_nacks_and_returns_settle_only_their_own_rows() -> None:
    def answer(ms: Sequence[Message]) -> Sent:
        return Sent([ACK, Confirm.NACKED, ACK, ACK, ACK], returned={"m2": "returned (312)"})

    pipeline, _ = _pipeline(FakeConnection(), answer)
    result = await pipeline.publish(BATCH)
    assert result.confirmed == ["m0", "m3", "m4"]
    assert {k: v.reason for k, v in result.failed.items()} == {
        "m1": Reason.NACKED, "m2": Reason.UNROUTABLE}


async def test_publish__missing_exchange_fails_its_rows_and_sends_the_rest() -> None:
    batch = [*BATCH[:2], Message("gone", "nope", "rk", b"{}", BATCH[0].properties, True)]
    pipeline, transport = _pipeline(FakeConnection(missing={"nope"}))
    result = await pipeline.publish(batch)
    assert transport.sends == [["m0", "m1"]]
    assert result.failed["gone"].reason is Reason.EXCHANGE_NOT_FOUND


async def test_publish__a_row_that_closes_the_channel_fails_alone_after_isolation() -> None:
    def closed(ms: Sequence[Message]) -> Sent:
        return Sent([ACK] + [Confirm.LOST] * 4, closed_by_broker="PRECONDITION_FAILED")

    def isolated(ms: Sequence[Message]) -> Sent:
        if ms[0].id == "m2":
            return Sent([Confirm.LOST], closed_by_broker="PRECONDITION_FAILED - invalid header")
        return Sent([Confirm.ACKED])

    pipeline, transport = _pipeline(FakeConnection(), closed, isolated, isolated, isolated,
                                    isolated)
    result = await pipeline.publish(BATCH)
    assert transport.sends == [["m0", "m1", "m2", "m3", "m4"], ["m1"], ["m2"], ["m3"], ["m4"]]
    assert sorted(result.confirmed) == ["m0", "m1", "m3", "m4"]
    assert result.failed["m2"].reason is Reason.CHANNEL_CLOSED_BY_ROW
    assert "invalid header" in result.failed["m2"].text
    assert transport.opened == 2  # reopened after each close


async def test_publish__a_silent_broker_is_an_outage_not_the_rows_fault() -> None:
    def silent(ms: Sequence[Message]) -> Sent:
        return Sent([Confirm.TIMEOUT] * len(ms), waited_s=15)

    conn = FakeConnection()
    pipeline, _ = _pipeline(conn, silent)
    result = await pipeline.publish(BATCH)
    assert result.unsent == {m.id: Reason.BROKER_LOST for m in BATCH}
    assert not result.failed
    assert conn.abandoned, "the silent connection is dropped so the supervisor reconnects"


async def test_publish__a_late_confirm_while_the_broker_confirms_others_is_not_the_rows_fault(
) -> None:
    """The broker is alive and the message may be routed already: charging an attempt for a
    late confirm delivered a row several times on a slow link and then parked it."""
    def partial(ms: Sequence[Message]) -> Sent:
        return Sent([Confirm.TIMEOUT if m.id == "m2" else Confirm.ACKED for m in ms], waited_s=15)

    conn = FakeConnection()
    pipeline, transport = _pipeline(conn, partial)
    result = await pipeline.publish(BATCH)
    assert sorted(result.confirmed) == ["m0", "m1", "m3", "m4"]
    assert not result.failed
    assert result.unsent == {"m2": Reason.DEADLINE}
    assert transport.sends == [["m0", "m1", "m2", "m3", "m4"]], "not sent again in the batch"
    assert not conn.abandoned


async def test_publish__a_destination_that_stops_confirming_is_left_alone_then_tried() -> None:
    """A queue whose confirms never come (a quorum queue without its majority) kept its rows
    at the head of every batch: every batch waited the whole budget, every retry handed the
    broker another copy. Now its destination is silent for a while: its rows are postponed
    (no attempt counted), the others flow, and then one message goes alone as a trial."""
    def shared_answer(ms: Sequence[Message]) -> Sent:
        return Sent([Confirm.TIMEOUT if m.exchange == "quorum" else ACK for m in ms],
                    waited_s=15)

    pipeline, shared, probe = _probed(FakeConnection(), lambda ms: Sent([Confirm.ACKED]),
                                      *[shared_answer] * 5)
    now = asyncio.get_running_loop().time()
    pipeline.destinations.prove("x", "rk", now)
    pipeline.destinations.prove("quorum", "rk", now)
    batch = [*_to("x", "a0", "a1"), *_to("quorum", "q0", "q1")]
    first = await pipeline.publish(batch)
    assert sorted(first.confirmed) == ["a0", "a1"]
    assert {k: (f.reason, d) for k, (f, d) in first.postponed.items()} == {
        "q0": (Reason.DESTINATION_SILENT, 5.0), "q1": (Reason.DESTINATION_SILENT, 5.0)}
    assert not first.failed
    assert not first.unsent
    # While it is silent its messages are not sent; the others are.
    second = await pipeline.publish([*_to("x", "a2"), *_to("quorum", "q2")])
    assert shared.sends[-1] == ["a2"]
    assert second.postponed["q2"][0].reason is Reason.DESTINATION_SILENT
    assert 0 < second.postponed["q2"][1] <= 5.0
    # Its while is over: one message goes alone on the probe channel; once the broker
    # confirms it, the destination flows again.
    pipeline.destinations._silent[("quorum", "rk")] = (0.0, 5.0)
    third = await pipeline.publish(_to("quorum", "q3", "q4"))
    assert probe.sends[-1] == ["q3"]
    assert third.confirmed == ["q3"]
    assert third.postponed["q4"][1] == 1.0
    await pipeline.publish(_to("quorum", "q5"))
    assert shared.sends[-1] == ["q5"], "it shares the busy channel again"


async def test_publish__nothing_confirmed_but_the_broker_answers_is_a_silent_destination(
) -> None:
    """A batch holding only a silent destination's rows dropped the whole broker connection
    (reconnected at once, every pass); a check answered by the broker says it is alive."""
    def silent(ms: Sequence[Message]) -> Sent:
        return Sent([Confirm.TIMEOUT] * len(ms), waited_s=15)

    conn = FakeConnection(answering=True)
    pipeline, _ = _pipeline(conn, silent)
    result = await pipeline.publish(BATCH)
    assert not conn.abandoned
    assert set(result.postponed) == {m.id for m in BATCH}
    assert not result.unsent
    assert not result.failed


async def test_publish__blocked_or_lost_broker_leaves_rows_untouched_with_the_cause() -> None:
    pipeline, transport = _pipeline(FakeConnection(blocked=True))
    result = await pipeline.publish(BATCH)
    assert transport.sends == []
    assert set(result.unsent.values()) == {Reason.BLOCKED}
    pipeline, _ = _pipeline(FakeConnection(connected=False))
    assert set((await pipeline.publish(BATCH)).unsent.values()) == {Reason.BROKER_LOST}


async def test_publish__a_spent_budget_leaves_rows_untouched_as_deadline() -> None:
    pipeline, transport = _pipeline(FakeConnection())
    result = await pipeline.publish(BATCH, deadline=asyncio.get_running_loop().time() - 1)
    assert transport.sends == []
    assert set(result.unsent.values()) == {Reason.DEADLINE}


async def test_publish__messages_the_encoder_refuses_are_never_sent() -> None:
    bad = Message("bad", "x", "k" * 300, b"{}", BATCH[0].properties, True)
    pipeline, transport = _pipeline(FakeConnection())
    result = await pipeline.publish([bad, BATCH[0]])
    assert transport.sends == [["m0"]]
    assert result.refused["bad"].reason is Reason.ENCODE_ERROR


# ---------------------------------------------------------------- the bulk transport's send


def _large_messages() -> list[Message]:
    """Four 600 KB messages: two to a write (relay/amqp/frames.py CHUNK_BYTES)."""
    return [Message(f"b{i}", "x", "rk", b"y" * 600_000, BATCH[0].properties, True)
            for i in range(4)]


async def _aiormq_close_frame(frame: Any) -> None:
    """aiormq's own channel.close reader (it queues the close-ok); nothing here."""


def _bulk(queue_size: int = 0) -> tuple[Bulk, _ConfirmChannel]:
    raw = SimpleNamespace(is_closed=False, write_queue=asyncio.Queue(maxsize=queue_size),
                          closing=asyncio.get_running_loop().create_future(),
                          _on_close_frame=_aiormq_close_frame)
    channel = _ConfirmChannel(raw, ConfirmTracker(), FrameEncoder(1, 131072, amqp_properties),
                              asyncio.Lock(), _Closing(raw))
    bulk = Bulk()
    bulk._confirm = channel
    return bulk, channel


async def test_bulk_send__one_write_settled_from_multiple_acks_nacks_and_returns() -> None:
    bulk, channel = _bulk()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(bulk.send(BATCH[:4], loop.time() + 5))
    frame = await asyncio.wait_for(channel.raw.write_queue.get(), timeout=5)
    assert frame.payload.count(b"\xce") == 12  # method, header, body per message, one write
    channel.returns.by_row["m1"] = "returned (312 NO_ROUTE)"
    channel.tracker.on_confirm(2, True, Confirm.ACKED)
    channel.tracker.on_confirm(3, False, Confirm.NACKED)
    channel.tracker.on_confirm(4, False, Confirm.ACKED)
    sent = await asyncio.wait_for(task, timeout=5)
    assert sent.status == [Confirm.ACKED, Confirm.ACKED, Confirm.NACKED, Confirm.ACKED]
    assert sent.returned == {"m1": "returned (312 NO_ROUTE)"}


async def test_bulk_send__unconfirmed_rows_time_out_and_later_confirms_are_ignored() -> None:
    bulk, channel = _bulk()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(bulk.send(BATCH[:2], loop.time() + 0.3))
    await channel.raw.write_queue.get()
    channel.tracker.on_confirm(1, False, Confirm.ACKED)
    sent = await task
    assert sent.status == [Confirm.ACKED, Confirm.TIMEOUT]
    assert sent.heard
    assert not channel.tracker.ranges


async def test_bulk_send__a_writer_that_takes_nothing_leaves_the_pass_not_sent() -> None:
    bulk, channel = _bulk(queue_size=1)
    channel.raw.write_queue.put_nowait(object())  # the writer is stuck (blocked broker)
    loop = asyncio.get_running_loop()
    sent = await asyncio.wait_for(bulk.send(BATCH[:3], loop.time() + 0.2), timeout=5)
    assert sent.status == [Confirm.NOT_SENT] * 3
    assert channel.tracker.next_tag == 1, "the tags are given back: numbering stays exact"


async def test_bulk_send__a_deadline_between_writes_keeps_what_was_confirmed_and_the_channel(
) -> None:
    """A slow link: the pass's first write went out and its first message was confirmed when
    the deadline came before the second write. The confirmed message stays confirmed, the
    written one is late (its fate unknown), the rest is not sent, the shared channel stays
    open and the next pass's tags follow the written messages. (Before: every message lost,
    the confirmed one included, and the channel closed under the other lanes.)"""
    bulk, channel = _bulk()
    big = _large_messages()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(bulk.send(big, loop.time() + 0.3))
    first = await asyncio.wait_for(channel.raw.write_queue.get(), timeout=5)
    assert 1_200_000 < len(first.payload) < 1_300_000  # two whole messages in the first write
    channel.tracker.on_confirm(1, False, Confirm.ACKED)  # the write's drain never completes: slow
    sent = await asyncio.wait_for(task, timeout=5)
    assert sent.status == [Confirm.ACKED, Confirm.TIMEOUT, Confirm.NOT_SENT, Confirm.NOT_SENT]
    assert not channel.closed
    assert channel.tracker.next_tag == 3


async def test_bulk_send__returns_are_read_from_the_channel_the_pass_went_on() -> None:
    """Another lane's pass saw the channel close and reopened it while this pass waited for
    its confirms: this pass's return came on the old channel and must settle its row as
    returned (read from the new channel's map, the row was deleted as published)."""
    bulk, channel = _bulk()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(bulk.send(BATCH[:2], loop.time() + 5))
    await asyncio.wait_for(channel.raw.write_queue.get(), timeout=5)
    channel.returns.by_row["m0"] = "returned (312 NO_ROUTE)"
    bulk._confirm, _ = _bulk()[1], None  # reopened: a new channel, its own returns
    channel.tracker.on_confirm(2, True, Confirm.ACKED)
    sent = await asyncio.wait_for(task, timeout=5)
    assert sent.status == [Confirm.ACKED, Confirm.ACKED]
    assert sent.returned == {"m0": "returned (312 NO_ROUTE)"}


async def test_bulk_send__a_channel_closed_between_writes_gets_no_more_frames() -> None:
    bulk, channel = _bulk()
    big = _large_messages()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(bulk.send(big, loop.time() + 5))
    first = await asyncio.wait_for(channel.raw.write_queue.get(), timeout=5)
    channel.raw.is_closed = True
    channel.tracker.abandon_all()
    first.drain()  # the writer drained the first write: the pass would write the next
    sent = await asyncio.wait_for(task, timeout=5)
    assert channel.raw.write_queue.empty(), "a write went to a closed channel's number"
    assert sent.status == [Confirm.LOST, Confirm.LOST, Confirm.NOT_SENT, Confirm.NOT_SENT]


async def test_publish__a_cancelled_error_from_the_library_is_a_lost_broker_not_a_stop() -> None:
    """aiormq cancels the futures of a connection its heartbeat dropped: the publish must end
    with the rows untouched, not raise CancelledError into the worker (which means stop)."""

    def dropped(ms: Sequence[Message]) -> Sent:
        raise asyncio.CancelledError

    conn = FakeConnection()
    pipeline, _ = _pipeline(conn, dropped, dropped, dropped)
    result = await pipeline.publish(BATCH)
    assert set(result.unsent.values()) == {Reason.BROKER_LOST}
    assert not result.failed


async def test_publish__a_real_cancellation_still_stops_the_publish() -> None:
    release = asyncio.Event()

    def slow(ms: Sequence[Message]) -> Sent:
        return Sent([Confirm.ACKED] * len(ms))

    class Waiting(ScriptedTransport):
        async def send(self, messages: Sequence[Message], deadline: float) -> Sent:
            await release.wait()
            return slow(messages)

    pipeline = Pipeline(FakeConnection(), Waiting([]), publish_timeout_s=15)  # type: ignore[arg-type]
    task = asyncio.ensure_future(pipeline.publish(BATCH))
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return
    raise AssertionError("a cancelled publish returned instead of stopping")


def _probed(conn: FakeConnection, probe_answer: Answer, *answers: Answer
            ) -> tuple[Pipeline, ScriptedTransport, ScriptedTransport]:
    transport = ScriptedTransport(list(answers))
    probe = ScriptedTransport([probe_answer] * 20)
    pipeline = Pipeline(conn, transport, publish_timeout_s=15, probe=probe)  # type: ignore[arg-type]
    return pipeline, transport, probe


def _to(exchange: str, *ids: str) -> list[Message]:
    return [Message(i, exchange, "rk", b"{}", BATCH[0].properties, True) for i in ids]


async def test_probe__the_first_message_to_a_new_exchange_goes_alone_then_the_rest_share() -> None:
    batch = [*_to("a", "a0", "a1"), *_to("b", "b0", "b1", "b2")]
    pipeline, shared, probe = _probed(FakeConnection(), lambda ms: Sent([Confirm.ACKED]))
    result = await pipeline.publish(batch)
    assert probe.sends == [["a0"], ["b0"]]
    assert shared.sends == [["a1", "b1", "b2"]]
    assert sorted(result.confirmed) == ["a0", "a1", "b0", "b1", "b2"]
    # Proven now: the next batch goes on the shared channel only.
    await pipeline.publish(_to("a", "a2"))
    assert probe.sends == [["a0"], ["b0"]]
    assert shared.sends[-1] == ["a2"]


async def test_probe__a_refusing_exchange_costs_no_other_message_and_is_remembered() -> None:
    """An exchange the relay may not write to (403) closed the shared channel: every lane's
    unconfirmed messages were re-sent (duplicates) and a good row could be blamed."""
    def probe_answer(ms: Sequence[Message]) -> Sent:
        if ms[0].exchange == "amq.rabbitmq.trace":
            return Sent([Confirm.LOST],
                        closed_by_broker="ACCESS_REFUSED - cannot publish to internal exchange")
        return Sent([Confirm.ACKED])

    batch = [*_to("good", "g0", "g1"), *_to("amq.rabbitmq.trace", "t0", "t1")]
    pipeline, shared, probe = _probed(FakeConnection(), probe_answer)
    result = await pipeline.publish(batch)
    assert shared.sends == [["g1"]]
    assert sorted(result.confirmed) == ["g0", "g1"]
    assert result.failed["t0"].reason is Reason.CHANNEL_CLOSED_BY_ROW
    assert result.failed["t1"].reason is Reason.DESTINATION_REFUSED
    again = await pipeline.publish(_to("amq.rabbitmq.trace", "t2"))
    assert again.failed["t2"].reason is Reason.DESTINATION_REFUSED
    assert ["t2"] not in probe.sends, "a remembered refusal is not sent again"


async def test_probe__after_a_shared_channel_close_the_rest_go_one_by_one_on_the_probe(
) -> None:
    """Isolation on the shared channel could be caught by another lane's message closing
    it, and a good row blamed; on the probe channel nothing else is in flight."""
    def closed(ms: Sequence[Message]) -> Sent:
        return Sent([ACK] + [Confirm.LOST] * (len(ms) - 1), closed_by_broker="ACCESS_REFUSED")

    def probe_answer(ms: Sequence[Message]) -> Sent:
        if ms[0].exchange == "y":  # its write permission was revoked after it was proven
            return Sent([Confirm.LOST], closed_by_broker="ACCESS_REFUSED - write access")
        return Sent([Confirm.ACKED])

    batch = [*_to("x", "m0", "m1"), *_to("y", "m2", "m5"), *_to("x", "m3", "m4")]
    pipeline, shared, probe = _probed(FakeConnection(), probe_answer, closed)
    now = asyncio.get_running_loop().time()
    pipeline.destinations.prove("x", "rk", now)
    pipeline.destinations.prove("y", "rk", now)
    result = await pipeline.publish(batch)
    assert shared.sends == [["m0", "m1", "m2", "m5", "m3", "m4"]]
    assert probe.sends == [["m1"], ["m2"], ["m3"], ["m4"]]
    assert sorted(result.confirmed) == ["m0", "m1", "m3", "m4"]
    assert result.failed["m2"].reason is Reason.CHANNEL_CLOSED_BY_ROW
    assert result.failed["m5"].reason is Reason.DESTINATION_REFUSED


async def test_probe__an_open_the_library_cancels_leaves_rows_unsent_not_a_crash() -> None:
    """aiormq cancels a channel open on a connection it drops (a heartbeat timeout): the
    CancelledError escaped the probe's open and `relay run` exited 1 with a traceback."""
    class DyingProbe(ScriptedTransport):
        async def open(self, connection: Any) -> None:
            raise asyncio.CancelledError

    probe = DyingProbe([])
    probe.usable = False
    pipeline = Pipeline(FakeConnection(), ScriptedTransport([]), publish_timeout_s=15,  # type: ignore[arg-type]
                        probe=probe)
    result = await pipeline.publish(_to("new", "n0", "n1"))
    assert set(result.unsent) == {"n0", "n1"}
    assert not result.confirmed


async def test_probe__a_404_close_is_exchange_not_found_not_a_channel_close() -> None:
    """When the passive check could not run, the broker's 404 on the probe names the fault,
    for the row that met it and, while it is remembered, for the exchange's other rows in the
    check's words (they were `destination_refused`: one fault, two reasons)."""
    def probe_answer(ms: Sequence[Message]) -> Sent:
        return Sent([Confirm.LOST], closed_by_broker="NOT_FOUND - no exchange 'gone' in vhost '/'")

    pipeline, _, probe = _probed(FakeConnection(), probe_answer)
    result = await pipeline.publish(_to("gone", "g0", "g1"))
    again = await pipeline.publish(_to("gone", "g2"))
    for fault in (result.failed["g0"], result.failed["g1"], again.failed["g2"]):
        assert fault.reason is Reason.EXCHANGE_NOT_FOUND
        assert fault.text.startswith("exchange 'gone' not found")
    assert probe.sends == [["g0"]], "a remembered 404 is not sent again"


def _keyed(exchange: str, *pairs: tuple[str, str]) -> list[Message]:
    return [Message(i, exchange, rk, b"{}", BATCH[0].properties, True) for i, rk in pairs]


TOPIC_CLOSE = ("ACCESS_REFUSED - write access to topic 'denied.1' in exchange 'orders' in "
               "vhost '/' refused for user 'relay'")


async def test_probe__a_refused_routing_key_fails_only_its_own_rows() -> None:
    """A topic permission refusing one routing key marked the whole exchange refused: good
    rows of other routing keys failed with it (and were parked after their attempts)."""
    def probe_answer(ms: Sequence[Message]) -> Sent:
        if ms[0].routing_key.startswith("denied"):
            return Sent([Confirm.LOST], closed_by_broker=TOPIC_CLOSE)
        return Sent([Confirm.ACKED])

    batch = _keyed("orders", ("d0", "denied.1"), ("d1", "denied.1"), ("g0", "ok.1"),
                   ("g1", "ok.2"))
    pipeline, shared, probe = _probed(FakeConnection(), probe_answer)
    result = await pipeline.publish(batch)
    # Refused, then the exchange is guarded: each routing key is proven on its own.
    assert probe.sends == [["d0"], ["g0"], ["g1"]]
    assert sorted(result.confirmed) == ["g0", "g1"]
    assert result.failed["d0"].reason is Reason.CHANNEL_CLOSED_BY_ROW
    assert result.failed["d1"].reason is Reason.DESTINATION_REFUSED
    assert "routing key 'denied.1'" in result.failed["d1"].text
    again = await pipeline.publish(_keyed("orders", ("g2", "ok.1"), ("g3", "ok.3"),
                                          ("d2", "denied.1")))
    assert shared.sends == [["g2"]]  # ok.1 is proven; ok.3 goes alone first
    assert probe.sends[-1] == ["g3"]
    assert sorted(again.confirmed) == ["g2", "g3"]
    assert again.failed["d2"].reason is Reason.DESTINATION_REFUSED


async def test_probe__a_denied_routing_key_closes_the_shared_channel_once_per_exchange() -> None:
    """On an exchange proven before any refusal, a denied routing key closes the shared
    channel (the relay cannot foresee it); from then on the exchange is guarded, and another
    denied routing key is found on the probe channel, not on the shared one."""
    def shared_answer(ms: Sequence[Message]) -> Sent:
        if any(m.routing_key.startswith("denied") for m in ms):
            return Sent([ACK] + [Confirm.LOST] * (len(ms) - 1), closed_by_broker=TOPIC_CLOSE)
        return Sent([Confirm.ACKED] * len(ms))

    def probe_answer(ms: Sequence[Message]) -> Sent:
        if ms[0].routing_key.startswith("denied"):
            return Sent([Confirm.LOST], closed_by_broker=TOPIC_CLOSE)
        return Sent([Confirm.ACKED])

    pipeline, shared, probe = _probed(FakeConnection(), probe_answer, *[shared_answer] * 5)
    pipeline.destinations.prove("orders", "ok.1", asyncio.get_running_loop().time())
    first = await pipeline.publish(_keyed("orders", ("g0", "ok.1"), ("d0", "denied.1"),
                                          ("g1", "ok.2")))
    assert len(shared.sends) == 1  # the close, then each unconfirmed message alone
    assert first.failed["d0"].reason is Reason.CHANNEL_CLOSED_BY_ROW
    assert sorted(first.confirmed) == ["g0", "g1"]
    shared.sends.clear()
    second = await pipeline.publish(_keyed("orders", ("g2", "ok.1"), ("d1", "denied.2"),
                                           ("g3", "ok.2")))
    assert all("d1" not in sent for sent in shared.sends), shared.sends
    assert ["d1"] in probe.sends
    assert second.failed["d1"].reason is Reason.CHANNEL_CLOSED_BY_ROW
    assert sorted(second.confirmed) == ["g2", "g3"]


async def test_probe__a_row_that_closed_a_channel_goes_alone_at_its_next_attempt() -> None:
    """It rode the shared channel again at its next attempt and closed it again, under every
    lane's messages (each re-sent: duplicates)."""
    def closed(ms: Sequence[Message]) -> Sent:
        return Sent([ACK] + [Confirm.LOST] * (len(ms) - 1),
                    closed_by_broker="PRECONDITION_FAILED")

    def probe_answer(ms: Sequence[Message]) -> Sent:
        if ms[0].id == "bad":
            return Sent([Confirm.LOST], closed_by_broker="PRECONDITION_FAILED - invalid arg")
        return Sent([Confirm.ACKED])

    pipeline, shared, probe = _probed(FakeConnection(), probe_answer, closed)
    pipeline.destinations.prove("x", "rk", asyncio.get_running_loop().time())
    first = await pipeline.publish(_to("x", "m0", "bad", "m1"))
    assert first.failed["bad"].reason is Reason.CHANNEL_CLOSED_BY_ROW
    shared.sends.clear()
    probe.sends.clear()
    second = await pipeline.publish(_to("x", "m2", "bad", "m3"))
    assert shared.sends == [["m2", "m3"]]
    assert probe.sends == [["bad"]]
    assert sorted(second.confirmed) == ["m2", "m3"]
    assert second.failed["bad"].reason is Reason.CHANNEL_CLOSED_BY_ROW


def test_returns__kept_for_unread_passes_up_to_a_bound_oldest_first() -> None:
    """A return that comes for a pass already ended is never read: the map must not grow
    without end."""
    from pamqp import commands as spec

    from relay.amqp.transports import _Returns

    returns = _Returns(kept=3)
    for i in range(5):
        props = spec.Basic.Properties(message_id=f"r{i}", headers={"x-outbox-id": f"r{i}"})
        returns(spec.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="x",
                                  routing_key="rk"), props)
    assert list(returns.by_row) == ["r2", "r3", "r4"]


async def test_bulk_send__the_brokers_channel_close_stops_the_writes_at_once() -> None:
    """The broker's channel.close is read while the pass writes: no later write is queued,
    although aiormq has not marked the channel closed yet (a frame after its close-ok would
    close the whole connection); what went out is lost, the rest not sent, with the reason."""
    bulk, channel = _bulk()
    big = _large_messages()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(bulk.send(big, loop.time() + 5))
    first = await asyncio.wait_for(channel.raw.write_queue.get(), timeout=5)
    await channel.raw._on_close_frame(spec.Channel.Close(404, "NOT_FOUND - no exchange 'x'"))
    first.drain()  # the pass resumes before aiormq marks the channel closed
    await asyncio.sleep(0.1)
    assert channel.raw.write_queue.empty(), "a write was queued after the broker's close"
    channel.raw.is_closed = True  # aiormq catches up
    channel.raw.closing.set_result(None)
    sent = await asyncio.wait_for(task, timeout=5)
    assert sent.status == [Confirm.LOST, Confirm.LOST, Confirm.NOT_SENT, Confirm.NOT_SENT]
    assert sent.closed_by_broker is not None
    assert "NOT_FOUND" in sent.closed_by_broker
