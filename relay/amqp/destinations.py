"""Which exchanges the broker has taken publishes to, and which it refused, on this connection.

Some refusals the encoder cannot foresee: the relay's user may not write to an exchange (403),
an exchange is internal (`amq.rabbitmq.trace`, 403). RabbitMQ answers them by closing the
channel, and a channel close loses the confirms of everything in flight on it. So the first
message to an exchange the relay has not yet published to on this connection goes alone, on a
probe channel nothing else uses; once the broker confirmed it, the exchange is *proven* and its
messages share the busy channel. A refusal is remembered for a while, for what it refused: the
exchange (the user may not write to it; it does not exist, then the rows fail as
`exchange_not_found`, the fault the exchange check names) or, when RabbitMQ's topic
permissions refused one routing key ("write access to topic 'k' in exchange 'x' ..."), that
routing key of the exchange alone. Rows it covers are failed without sending (retried later
with backoff, parked after the attempts) instead of closing a channel again for each; the
exchange's other routing keys go on. An exchange where a topic permission refused once is
*guarded*: from then on each of its routing keys is proven on its own (its first message goes
alone), so a denied routing key closes the shared channel at most once per exchange, not once
per key. A row that closed a channel goes alone, on the probe
channel, at every later attempt this process makes: it never rides the shared channel again,
where its close would lose the confirms of every lane's messages.

A destination (exchange and routing key) whose confirm did not come by a batch's deadline while
the broker confirmed other messages, or while it answered a check, has stopped confirming (a
quorum queue without its majority): it is *silent*. Its rows are not sent for a while (5 s,
doubling up to 60 s at each miss): they are postponed in the database, no attempt counted, so
every other destination flows at full speed and no batch waits its whole budget for it. When
the while is over, one message goes alone on the probe channel; the destination is answered
again once the broker confirms it. Pure state, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.interfaces import Fault, Reason

PROVEN_TTL_S = 300.0  # permissions can change: probe again now and then
REFUSED_TTL_S = 30.0  # a refusal is remembered this long, then one message probes again
SILENT_FIRST_S = 5.0  # a destination that stopped confirming is left alone this long at first
SILENT_MAX_S = 60.0  # ... doubling at each miss up to this
MAX_ENTRIES = 10_000
# What RabbitMQ's close says when a topic permission, not the exchange, refused the publish
# (rabbit_access_control: "~s access to topic '~ts' in exchange ~ts refused for user '~ts'").
TOPIC_REFUSAL = "access to topic "


def refused_routing_key(why: str) -> bool:
    """The broker's close refused the publish's routing key, not the whole exchange."""
    return TOPIC_REFUSAL in why


def exchange_missing(why: str) -> bool:
    """The broker's close says the exchange does not exist (404 NOT_FOUND)."""
    return "NOT_FOUND" in why


@dataclass
class Destinations:
    """Proven and refused exchanges of one broker connection (time is the loop's clock)."""

    proven_ttl_s: float = PROVEN_TTL_S
    refused_ttl_s: float = REFUSED_TTL_S
    # An exchange, or (exchange, routing key) on a guarded exchange.
    _proven: dict[str | tuple[str, str], float] = field(default_factory=dict)
    _guarded: dict[str, None] = field(default_factory=dict)
    # (exchange, None): the whole exchange; (exchange, routing key): that key alone.
    _refused: dict[tuple[str, str | None], tuple[float, str]] = field(default_factory=dict)
    _closers: dict[str, None] = field(default_factory=dict)  # ids of rows that closed one
    # (exchange, routing key) -> (loop time until which it is left alone, that backoff's s)
    _silent: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def subject(self, exchange: str, routing_key: str) -> str | tuple[str, str]:
        """What one probe proves: the exchange, or on a guarded exchange the routing key."""
        return (exchange, routing_key) if exchange in self._guarded else exchange

    def proven(self, exchange: str, routing_key: str, now: float) -> bool:
        """The broker took a publish to this exchange (on a guarded exchange: with this
        routing key) recently on this connection."""
        at = self._proven.get(self.subject(exchange, routing_key))
        return at is not None and now - at < self.proven_ttl_s

    def refusal(self, exchange: str, routing_key: str, now: float) -> Fault | None:
        """Why the broker refused this exchange, or this routing key of it, recently."""
        for key in ((exchange, None), (exchange, routing_key)):
            entry = self._refused.get(key)
            if entry is None or now - entry[0] >= self.refused_ttl_s:
                continue
            later = f"tried again after {self.refused_ttl_s:g}s"
            if key[1] is None and exchange_missing(entry[1]):
                # The same fault as the exchange check finds, in the same words.
                return Fault(Reason.EXCHANGE_NOT_FOUND,
                             f"exchange {exchange!r} not found at the relay's last publish, "
                             f"not sent ({later}): {entry[1]}")
            what = (f"exchange {exchange!r}" if key[1] is None
                    else f"routing key {routing_key!r} of exchange {exchange!r}")
            return Fault(Reason.DESTINATION_REFUSED,
                         f"{what} refused the relay's last publish, not sent ({later}): "
                         f"{entry[1]}")
        return None

    def prove(self, exchange: str, routing_key: str, now: float) -> None:
        """The broker confirmed a publish to this exchange with this routing key."""
        if len(self._proven) >= MAX_ENTRIES:
            self._proven.clear()
        self._proven[exchange] = now
        self._proven[self.subject(exchange, routing_key)] = now
        self._refused.pop((exchange, None), None)

    def refuse(self, exchange: str, routing_key: str, why: str, now: float) -> None:
        """The broker closed the probe channel for a publish to this exchange with this
        routing key: remember the routing key when a topic permission refused it, else the
        exchange."""
        if len(self._refused) >= MAX_ENTRIES:
            self._refused.clear()
        if refused_routing_key(why):
            self._refused[(exchange, routing_key)] = (now, why[:300])
            if len(self._guarded) >= MAX_ENTRIES:
                self._guarded.clear()
            self._guarded[exchange] = None
            return
        self._refused[(exchange, None)] = (now, why[:300])
        self._proven.pop(exchange, None)

    def missed(self, exchange: str, routing_key: str, now: float) -> float:
        """This destination's confirm did not come by the deadline while the broker answered:
        leave it alone for a while (longer at each miss); returns how long."""
        previous = self._silent.get((exchange, routing_key))
        backoff = SILENT_FIRST_S if previous is None else min(previous[1] * 2, SILENT_MAX_S)
        if previous is None and len(self._silent) >= MAX_ENTRIES:
            self._silent.clear()
        self._silent[(exchange, routing_key)] = (now + backoff, backoff)
        return backoff

    def silence(self, exchange: str, routing_key: str, now: float) -> tuple[Fault, float] | None:
        """Why this destination is left alone now, and for how many seconds more, if it is."""
        entry = self._silent.get((exchange, routing_key))
        if entry is None or now >= entry[0]:
            return None
        return Fault(Reason.DESTINATION_SILENT,
                     f"no confirm from exchange {exchange!r} with routing key {routing_key!r} "
                     f"by the last deadline while the broker answered: not sent for "
                     f"{entry[1]:g}s"), entry[0] - now

    def on_trial(self, exchange: str, routing_key: str, now: float) -> bool:
        """It was silent and its while is over: its next message goes alone first."""
        entry = self._silent.get((exchange, routing_key))
        return entry is not None and now >= entry[0]

    def answered(self, exchange: str, routing_key: str) -> None:
        """The broker confirmed a message to this destination: it flows again."""
        self._silent.pop((exchange, routing_key), None)

    def closed_channel(self, row_id: str) -> None:
        """This row's publish closed a channel: it goes alone from now on."""
        if len(self._closers) >= MAX_ENTRIES:
            self._closers.pop(next(iter(self._closers)))
        self._closers[row_id] = None

    def goes_alone(self, row_id: str) -> bool:
        """This row closed a channel before."""
        return row_id in self._closers

    def forget_proven(self) -> None:
        """A new connection (maybe to another node, as another user): prove again."""
        self._proven.clear()
        self._guarded.clear()
