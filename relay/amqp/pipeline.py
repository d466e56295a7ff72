"""The one publish pipeline: passes of exchange check, send, settle, over either transport.

A batch's publish is a few passes, all ending by the batch's deadline:

1. check the exchanges the pending messages name (passively, cached): rows naming a missing
   one fail (`exchange_not_found`);
2. send the rest through the transport (per-message or bulk frames) and settle each message
   from what the broker said: acked and not returned -> confirmed; returned -> `unroutable`;
   nacked -> `nacked`; no confirm by the deadline -> unknown (a late confirm is not the row's
   fault);
   Before that, the first message to an exchange not yet proven on this connection goes alone
   on the probe channel (relay/amqp/destinations.py): a refusal the encoder cannot foresee
   (permissions, an internal exchange) closes only that channel, fails only that row
   (`channel_closed_by_row`), and the exchange's other rows (or, when a topic permission
   refused one routing key, that key's rows) fail unsent for a while (`destination_refused`);
   a row that closed a channel goes alone on the probe channel at every later attempt;
3. when the broker closed the shared channel under the pass anyway, everything unconfirmed on
   it is sent again one message at a time on the probe channel, so that the row that closes it
   alone fails (`channel_closed_by_row`) and the others are delivered.

Messages whose fate stays unknown are `unsent` with an outside cause (broker_lost, blocked,
deadline, shutdown): their rows are left untouched. A destination none of whose messages was
confirmed by the deadline while the broker confirmed others, or answered a check, has stopped
confirming (relay/amqp/destinations.py): its rows are postponed (no attempt counted) and it is
left alone for a while, then tried with one message. A pass where the broker confirmed nothing
before the deadline and does not answer a check either is a silent broker, not a fault of those
rows: the connection is dropped (the supervisor reconnects) and the rows are untouched.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

import structlog

from relay.amqp import compat
from relay.amqp.connection import BrokerConnection
from relay.amqp.destinations import Destinations, exchange_missing
from relay.amqp.encoder import Encoder
from relay.amqp.frames import HEARD, Confirm
from relay.amqp.transports import Bulk, PerMessage, Sent, Transport
from relay.interfaces import Fault, Message, OutboxRow, PublishResult, Reason
from relay.supervise import Supervisor

log = structlog.get_logger("relay.amqp.pipeline")

PASSES = 3
# How long a broker that confirmed nothing by a deadline has to answer a check before the
# connection is taken for dead.
ANSWER_TIMEOUT_S = 2.0
# Messages of a destination on trial wait this long while its one trial message goes alone.
TRIAL_WAIT_S = 1.0
# Channel-close reasons that are about the exchange, not about one message's properties.
_DESTINATION_CODES = ("ACCESS_REFUSED", "NOT_FOUND")


class Pipeline:
    """The relay's Publisher (relay/interfaces.py): one connection, one transport."""

    def __init__(
        self,
        connection: BrokerConnection,
        transport: Transport,
        *,
        publish_timeout_s: float,
        encoder: Encoder | None = None,
        probe: Transport | None = None,
    ) -> None:
        self.connection = connection
        self.transport = transport
        self.publish_timeout_s = publish_timeout_s
        self.encoder = encoder or Encoder()
        self.encoder.broker_user = connection.user
        self._reopen_lock = asyncio.Lock()
        # The probe channel (relay/amqp/destinations.py): the first message to an exchange
        # not yet proven on this connection, and every message sent alone after a channel
        # close, go there, where nothing else is in flight. None: no probing (tests).
        self.probe = probe
        self.destinations = Destinations()
        self._probe_lock = asyncio.Lock()
        connection.on_open(self._opened)

    async def _opened(self, raw: object) -> None:
        self.destinations.forget_proven()
        # A header frame larger than the size the broker negotiated closes the connection:
        # the encoder checks against this connection's value, not a constant.
        negotiated = compat.connection_frame_max(raw)
        if negotiated:
            self.encoder.frame_max = negotiated
        await self.transport.open(raw)

    # ------------------------------------------------------------------ state, for the worker

    @property
    def supervisor(self) -> Supervisor:
        """The broker connection's supervisor (state for /healthz)."""
        return self.connection.supervisor

    @property
    def connected(self) -> bool:
        """The broker connection is open."""
        return self.connection.connected

    @property
    def blocked(self) -> bool:
        """The broker blocks publishers (connection.blocked)."""
        return self.connection.blocked

    @property
    def ready(self) -> bool:
        """Connected and not blocked."""
        return self.connection.ready

    async def connect(self) -> None:
        """Connect (supervised: waits for the broker as the supervisor allows)."""
        await self.connection.connect()

    async def wait_ready(self) -> None:
        """Return once connected and unblocked (reconnecting as needed)."""
        await self.connection.wait_ready()

    async def close(self) -> None:
        """Close the connection; safe to call twice."""
        await self.connection.close()

    def build(self, row: OutboxRow) -> Message | Fault:
        """The row's wire form, or why the broker would refuse it (relay/amqp/encoder.py)."""
        return self.encoder.build(row)

    # ------------------------------------------------------------------ the pass loop

    async def publish(
        self, messages: Sequence[Message], *, deadline: float | None = None
    ) -> PublishResult:
        """Publish with confirms; every message ends in exactly one field of the result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.publish_timeout_s if deadline is None else deadline
        result = PublishResult()
        pending: list[Message] = []
        for m in messages:  # messages built elsewhere (tests, benchmarks) are checked here too
            fault = None if m.checked else self.encoder.check(m)
            if fault is None:
                pending.append(m)
            else:
                result.refused[m.id] = fault
        isolate = False
        for _ in range(PASSES):
            if not pending or self._outside_cause(deadline) is not None:
                break
            pending = await self._checked(pending, result, deadline)
            if pending and self.probe is not None:
                pending = await self._proven(pending, result, deadline)
            if not pending or not await self._channel_ready(deadline):
                break
            pending, closed = await (self._isolated if isolate else self._pass)(
                pending, result, deadline
            )
            if closed:
                # Everything unconfirmed on the closed channel counts as not published.
                self.connection.exchanges.forget()
                isolate = True
        cause = self._outside_cause(deadline) or Reason.BROKER_LOST
        for m in pending:
            result.unsent[m.id] = cause
        _log_faults(result)
        return result

    def _outside_cause(self, deadline: float) -> Reason | None:
        if self.connection.supervisor.stopping.is_set():
            return Reason.SHUTDOWN
        if not self.connection.connected:
            return Reason.BROKER_LOST
        if self.connection.blocked:
            return Reason.BLOCKED
        if asyncio.get_running_loop().time() >= deadline:
            return Reason.DEADLINE
        return None

    async def _checked(self, pending: list[Message], result: PublishResult,
                       deadline: float) -> list[Message]:
        """Fail the messages whose exchange does not exist; return the others."""
        left = deadline - asyncio.get_running_loop().time()
        try:
            missing = await asyncio.wait_for(
                self.connection.missing_exchanges({m.exchange for m in pending}), timeout=left
            )
        except asyncio.CancelledError:
            _reraise_if_cancelled()
            return pending  # aiormq cancelled the RPC: its connection died under it
        except (TimeoutError, *compat.BROKER_LOST, *compat.CHANNEL_GONE):
            return pending  # the connection is going down: the loop finds out and stops
        sendable = []
        for m in pending:
            if m.exchange in missing:
                result.failed[m.id] = Fault(Reason.EXCHANGE_NOT_FOUND,
                                            f"exchange {m.exchange!r} not found")
            else:
                sendable.append(m)
        return sendable

    async def _channel_ready(self, deadline: float) -> bool:
        """The transport's channel is open, reopened (by the deadline) when a close took it
        away."""
        loop_time = asyncio.get_running_loop().time
        async with self._reopen_lock:
            if self.transport.usable:
                return True
            if not self.connection.connected:
                return False
            try:
                # Bounded by the batch's deadline: an open that hangs (a broker gone silent)
                # must not hold the claim past the idle-in-transaction bound.
                await asyncio.wait_for(self.transport.open(self.connection.raw),
                                       timeout=max(deadline - loop_time(), 0.0))
            except asyncio.CancelledError:
                _reraise_if_cancelled()  # aiormq cancelled the open: its connection died
                return False
            except (TimeoutError, RuntimeError, *compat.BROKER_LOST, *compat.CHANNEL_GONE):
                # aio-pika raises RuntimeError for a channel on a connection that just closed.
                return False
            return True

    async def _pass(self, messages: list[Message], result: PublishResult,
                    deadline: float) -> tuple[list[Message], bool]:
        """One send of all messages; returns those whose fate is unknown, and whether the
        broker closed the channel under them."""
        sent = await self._send(messages, deadline)
        unknown = await self._settle(messages, sent, result, self.transport)
        return unknown, sent.closed_by_broker is not None

    async def _send(self, messages: list[Message], deadline: float,
                    transport: Transport | None = None) -> Sent:
        """The transport's send; a connection that dies under it leaves the pass unknown."""
        try:
            return await (transport or self.transport).send(messages, deadline)
        except asyncio.CancelledError:
            _reraise_if_cancelled()  # aiormq cancels what waits on a connection it dropped
        except (*compat.BROKER_LOST, *compat.CHANNEL_GONE, RuntimeError):
            pass
        return Sent([Confirm.LOST] * len(messages))

    async def _isolated(self, messages: list[Message], result: PublishResult,
                        deadline: float) -> tuple[list[Message], bool]:
        """One message per send, on the probe channel where nothing else is in flight (or on
        the shared one without a probe); a message whose send closes the channel alone fails."""
        loop = asyncio.get_running_loop()
        for index, m in enumerate(messages):
            if self._outside_cause(deadline) is not None:
                return messages[index:], False
            refusal = self.destinations.refusal(m.exchange, m.routing_key, loop.time())
            if refusal is not None:  # an earlier message of this pass found it refusing
                result.failed[m.id] = refusal
                continue
            sent = await self._alone(m, deadline)
            if sent is None:
                return messages[index:], False
            if sent.closed_by_broker is not None and sent.status[0] not in HEARD:
                self._refused(m, sent.closed_by_broker, result)
                continue
            if sent.status[0] in HEARD:
                self.destinations.prove(m.exchange, m.routing_key, loop.time())
                self.destinations.answered(m.exchange, m.routing_key)
            if await self._settle([m], sent, result, self.probe or self.transport):
                return messages[index:], False
        return [], False

    async def _alone(self, m: Message, deadline: float) -> Sent | None:
        """Send one message where nothing else is in flight; None: no channel to send on."""
        if self.probe is None:
            if not await self._channel_ready(deadline):
                return None
            return await self._send([m], deadline)
        async with self._probe_lock:
            if not self.probe.usable:
                if not self.connection.connected:
                    return None
                left = deadline - asyncio.get_running_loop().time()
                try:
                    await asyncio.wait_for(self.probe.open(self.connection.raw),
                                           timeout=max(left, 0.0))
                except asyncio.CancelledError:
                    _reraise_if_cancelled()  # aiormq cancelled the open: its connection died
                    return None
                except (TimeoutError, RuntimeError, *compat.BROKER_LOST, *compat.CHANNEL_GONE):
                    return None
            return await self._send([m], deadline, self.probe)

    def _refused(self, m: Message, why: str, result: PublishResult) -> None:
        """The broker closed the channel for this message alone: it fails; when the close
        says the exchange refuses the relay (403 access refused, 404 not found, not a 406 about
        this message's properties), the exchange (or, for a topic permission, the routing key)
        is remembered as refusing too. The row goes alone from now on."""
        self.destinations.closed_channel(m.id)
        if any(code in why for code in _DESTINATION_CODES):
            self.destinations.refuse(m.exchange, m.routing_key, why,
                                     asyncio.get_running_loop().time())
        if exchange_missing(why):
            # The exchange check missed it (a side channel that could not check, an exchange
            # deleted since): the broker's 404 says what it is.
            result.failed[m.id] = Fault(Reason.EXCHANGE_NOT_FOUND,
                                        f"exchange {m.exchange!r} not found ({why})")
            return
        result.failed[m.id] = Fault(
            Reason.CHANNEL_CLOSED_BY_ROW,
            f"the broker closed the channel when this message was published "
            f"(exchange {m.exchange!r}, key {m.routing_key!r}): {why}",
        )

    async def _proven(self, pending: list[Message], result: PublishResult,
                      deadline: float) -> list[Message]:
        """The messages that may go on the shared channel: those to proven exchanges, and
        the rest of an exchange whose first message the probe channel just got confirmed.
        Messages to an exchange (or routing key) that refused lately fail without being sent;
        a message whose row closed a channel before is sent alone here."""
        loop = asyncio.get_running_loop()
        shared: list[Message] = []
        waiting: dict[str | tuple[str, str], list[Message]] = {}
        alone: list[Message] = []
        trials: set[tuple[str, str]] = set()
        for m in pending:
            now = loop.time()
            if self._held_back(m, now, trials, result):
                continue
            if self.destinations.on_trial(m.exchange, m.routing_key, now):
                trials.add((m.exchange, m.routing_key))
                alone.append(m)
            elif self.destinations.goes_alone(m.id):
                alone.append(m)
            elif self.destinations.proven(m.exchange, m.routing_key, now):
                shared.append(m)
            else:
                waiting.setdefault(self.destinations.subject(m.exchange, m.routing_key),
                                   []).append(m)
        for group in waiting.values():
            now = loop.time()
            if all(self.destinations.proven(m.exchange, m.routing_key, now) for m in group):
                shared += group  # another lane proved it
            else:
                shared += await self._probe(group, result, deadline)
        if alone:
            unanswered, _ = await self._isolated(alone, result, deadline)
            for m in unanswered:
                result.unsent[m.id] = self._outside_cause(deadline) or Reason.BROKER_LOST
        order = {m.id: i for i, m in enumerate(pending)}
        return sorted(shared, key=lambda m: order[m.id])

    def _held_back(self, m: Message, now: float, trials: set[tuple[str, str]],
                   result: PublishResult) -> bool:
        """Settle, unsent, a message whose destination refused lately (failed) or stopped
        confirming (postponed; on trial: all but the one message that goes first)."""
        refusal = self.destinations.refusal(m.exchange, m.routing_key, now)
        if refusal is not None:
            result.failed[m.id] = refusal
            return True
        silence = self.destinations.silence(m.exchange, m.routing_key, now)
        if silence is not None:
            result.postponed[m.id] = silence
            return True
        if (m.exchange, m.routing_key) in trials:
            result.postponed[m.id] = (Fault(
                Reason.DESTINATION_SILENT,
                "waiting for one message to show that its destination confirms again"),
                TRIAL_WAIT_S)
            return True
        return False

    async def _probe(self, group: list[Message], result: PublishResult,
                     deadline: float) -> list[Message]:
        """Send the first message of an unproven exchange (or routing key) alone; return the
        rest once the broker confirmed it and it proved them. When the broker closed the
        channel for it, fail it and the rest its refusal covers; then the next one probes."""
        loop = asyncio.get_running_loop()
        ready: list[Message] = []
        while group:
            first, rest = group[0], group[1:]
            cause = self._outside_cause(deadline)
            sent = None if cause is not None else await self._alone(first, deadline)
            if sent is not None and sent.closed_by_broker is not None \
                    and sent.status[0] not in HEARD:
                self._refused(first, sent.closed_by_broker, result)
                now = loop.time()
                group = [m for m in rest if not self._held_back(m, now, set(), result)]
                continue
            if sent is not None and sent.status[0] in HEARD:
                self.destinations.prove(first.exchange, first.routing_key, loop.time())
                await self._settle([first], sent, result)
                now = loop.time()
                ready += [m for m in rest
                          if self.destinations.proven(m.exchange, m.routing_key, now)]
                group = [m for m in rest
                         if not self.destinations.proven(m.exchange, m.routing_key, now)]
                continue
            if sent is not None and sent.status[0] == Confirm.TIMEOUT and self._waited_long(sent) \
                    and await self.connection.answers(ANSWER_TIMEOUT_S):
                # The broker answers, the probe's destination does not confirm: that one is
                # silent; the rest go on (those to the same destination wait with it).
                await self._silent_destinations([first], result, self.probe)
                now = loop.time()
                group = [m for m in rest if not self._held_back(m, now, set(), result)]
                continue
            # No answer for the probe: its fate and its exchange's are unknown; leave them.
            for m in group:
                result.unsent[m.id] = self._outside_cause(deadline) or Reason.BROKER_LOST
            return ready
        return ready

    async def _settle(self, messages: list[Message], sent: Sent, result: PublishResult,
                      transport: Transport | None = None) -> list[Message]:
        """Each message's fate from what the broker said about the pass `transport` sent."""
        unknown: list[Message] = []
        late: list[Message] = []
        silent = False
        waited_long = self._waited_long(sent)
        # Destinations the broker confirmed something of in this pass: a late confirm of theirs
        # is a slow link or a busy queue, not a destination that stopped confirming.
        answering = {(m.exchange, m.routing_key)
                     for m, status in zip(messages, sent.status, strict=True)
                     if status in HEARD}
        # Names bound once: a lookup on the enum class per message costs several times one.
        acked, nacked, timeout, heard = Confirm.ACKED, Confirm.NACKED, Confirm.TIMEOUT, sent.heard
        for m, status in zip(messages, sent.status, strict=True):
            returned = sent.returned.get(m.id)
            if status == acked and returned is None:
                result.confirmed.append(m.id)
            elif status == acked:
                result.failed[m.id] = Fault(Reason.UNROUTABLE, returned or "returned")
            elif status == nacked:
                result.failed[m.id] = Fault(Reason.NACKED, "nacked by the broker")
            elif status == timeout and heard:
                # The broker confirmed others of the pass: it is alive and this confirm is
                # late, not refused. The message may well be routed already, so it is no fault
                # of the row: no attempt counted (charging one delivered the row several times
                # and then parked it). Not sent again in this batch: the deadline has passed.
                if (m.exchange, m.routing_key) in answering or not waited_long:
                    result.unsent[m.id] = Reason.DEADLINE  # a slow link, a busy queue
                else:
                    late.append(m)  # nothing of its destination confirmed: silent
            else:
                alive = self.connection.blocked or sent.others_heard
                if status == timeout and waited_long and not alive:
                    silent = True
                    late.append(m)
                else:
                    unknown.append(m)
        if silent and not await self.connection.answers(ANSWER_TIMEOUT_S):
            # Nothing was confirmed, on this pass or on the channel meanwhile, and the broker
            # does not answer a check: a broker that stopped answering (a silent network cut),
            # not these rows' fault. Drop the connection; the supervisor reconnects.
            await self.connection.abandon("no confirm from the broker within the deadline")
            return unknown + late
        if late:
            await self._silent_destinations(late, result, transport)
        return unknown

    def _waited_long(self, sent: Sent) -> bool:
        """The pass waited long enough for its confirms to say something: one cut short by
        the end of the batch's budget proves nothing about the broker or a destination."""
        return sent.waited_s >= min(self.publish_timeout_s / 2, 5.0)

    async def _silent_destinations(self, late: list[Message], result: PublishResult,
                                   transport: Transport | None) -> None:
        """The broker is alive and confirmed nothing of these messages' destinations by the
        deadline: each destination is left alone for a while, and its rows are postponed (no
        attempt counted; they may have been routed: sent again when it confirms again). The
        channel they went on is closed: a message it still waits for holds back the confirms
        of every later one on it (measured: a classic queue's message sent after a quorum
        queue's without its majority was never confirmed on that channel)."""
        if transport is not None:
            await transport.discard()
        now = asyncio.get_running_loop().time()
        backoff = {dest: self.destinations.missed(*dest, now)
                   for dest in dict.fromkeys((m.exchange, m.routing_key) for m in late)}
        for (exchange, routing_key), backoff_s in backoff.items():
            log.warning("destination_silent", exchange=exchange, routing_key=routing_key,
                        backoff_s=backoff_s)
        for m in late:
            silence = self.destinations.silence(m.exchange, m.routing_key, now)
            assert silence is not None  # missed() just now
            result.postponed[m.id] = (silence[0], backoff[(m.exchange, m.routing_key)])


def _reraise_if_cancelled() -> None:
    """Re-raise a CancelledError that is a real cancellation of this task (a stop); one raised
    by the broker library for a connection it dropped is not, and is swallowed."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _log_faults(result: PublishResult) -> None:
    """One log line per cause per batch, with a count (never one line per row)."""
    if result.unsent:
        for reason, count in Counter(result.unsent.values()).items():
            log.warning("batch_unsent", reason=reason.value, count=count)


class AmqpPublisher(Pipeline):
    """The pipeline over the per-message transport (RELAY_PUBLISHER=simple)."""

    def __init__(self, url: str, *, publish_timeout_s: float, reconnect_max_s: float = 30.0,
                 supervisor: Supervisor | None = None, encoder: Encoder | None = None,
                 role: str = "") -> None:
        super().__init__(_connection(url, reconnect_max_s, supervisor, role), PerMessage(),
                         publish_timeout_s=publish_timeout_s, encoder=encoder,
                         probe=PerMessage())


class BulkPublisher(Pipeline):
    """The pipeline over the bulk-frames transport (RELAY_PUBLISHER=bulk, the default)."""

    def __init__(self, url: str, *, publish_timeout_s: float, reconnect_max_s: float = 30.0,
                 supervisor: Supervisor | None = None, encoder: Encoder | None = None,
                 role: str = "") -> None:
        super().__init__(_connection(url, reconnect_max_s, supervisor, role), Bulk(),
                         publish_timeout_s=publish_timeout_s, encoder=encoder,
                         probe=PerMessage())


def _connection(url: str, reconnect_max_s: float, supervisor: Supervisor | None,
                role: str = "") -> BrokerConnection:
    from relay.dsn import redact
    from relay.supervise import Backoff

    sup = supervisor or Supervisor("broker", backoff=Backoff(max_s=reconnect_max_s),
                                   describe=redact(url))
    return BrokerConnection(url, supervisor=sup, role=role)
