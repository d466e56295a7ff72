"""Which exchanges the broker has taken publishes to, and which it refused, on this connection.

Some refusals the encoder cannot foresee: the relay's user may not write to an exchange (403),
an exchange is internal (`amq.rabbitmq.trace`, 403). RabbitMQ answers them by closing the
channel, and a channel close loses the confirms of everything in flight on it. So the first
message to an exchange the relay has not yet published to on this connection goes alone, on a
probe channel nothing else uses; once the broker confirmed it, the exchange is *proven* and its
messages share the busy channel. An exchange that refused is remembered for a while: its rows
are failed without sending (retried later with backoff, parked after the attempts) instead of
closing a channel again for each. Pure state, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.interfaces import Fault, Reason

PROVEN_TTL_S = 300.0  # permissions can change: probe again now and then
REFUSED_TTL_S = 30.0  # a refusal is remembered this long, then one message probes again
MAX_ENTRIES = 10_000


@dataclass
class Destinations:
    """Proven and refused exchanges of one broker connection (time is the loop's clock)."""

    proven_ttl_s: float = PROVEN_TTL_S
    refused_ttl_s: float = REFUSED_TTL_S
    _proven: dict[str, float] = field(default_factory=dict)
    _refused: dict[str, tuple[float, str]] = field(default_factory=dict)

    def proven(self, exchange: str, now: float) -> bool:
        """The broker took a publish to this exchange recently on this connection."""
        at = self._proven.get(exchange)
        return at is not None and now - at < self.proven_ttl_s

    def refusal(self, exchange: str, now: float) -> Fault | None:
        """Why the broker refused this exchange recently, if it did."""
        entry = self._refused.get(exchange)
        if entry is None or now - entry[0] >= self.refused_ttl_s:
            return None
        return Fault(Reason.DESTINATION_REFUSED,
                     f"exchange {exchange!r} refused the relay's last publish, not sent "
                     f"(tried again after {self.refused_ttl_s:g}s): {entry[1]}")

    def prove(self, exchange: str, now: float) -> None:
        """The broker confirmed a publish to this exchange."""
        if len(self._proven) >= MAX_ENTRIES:
            self._proven.clear()
        self._proven[exchange] = now
        self._refused.pop(exchange, None)

    def refuse(self, exchange: str, why: str, now: float) -> None:
        """The broker closed the probe channel for a publish to this exchange."""
        if len(self._refused) >= MAX_ENTRIES:
            self._refused.clear()
        self._refused[exchange] = (now, why[:300])
        self._proven.pop(exchange, None)

    def forget_proven(self) -> None:
        """A new connection (maybe to another node, as another user): prove again."""
        self._proven.clear()
