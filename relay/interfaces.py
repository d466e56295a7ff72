"""The small seams between the worker and its drivers: rows, messages, outcomes, protocols."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from relay.options import Properties

if TYPE_CHECKING:
    from relay.settings import Settings


class OutboxRow(NamedTuple):
    """One claimed row, as the store hands it to the worker.

    exchange, routing_key and content may be NULL in a table of the classic shape (no NOT NULL
    constraints); the worker dead-letters such rows instead of failing on them.
    """

    id: str
    exchange: str | None
    routing_key: str | None
    content: str | None
    options: str | None
    attempts: int
    created_at_s: float | None = None  # epoch seconds (database clock), for the age metric
    ordering_key: str | None = None


@dataclass(slots=True)
class Message:
    """One AMQP publish: the row id travels as message_id (or the x-outbox-id header)."""

    id: str
    exchange: str
    routing_key: str
    body: bytes
    properties: Properties
    mandatory: bool


@dataclass(slots=True)
class PublishResult:
    """What became of a batch of publishes.

    confirmed: acked by the broker and not returned; failed: the broker refused them (nack,
    return, missing exchange, confirm timeout) with a reason; unsent: their fate is unknown
    because the connection was lost, so they are left as they were.
    """

    confirmed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unsent: list[str] = field(default_factory=list)
    broker_lost: bool = False
    # Refused before publishing because the broker would refuse them every time (dead letters).
    invalid: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Settlement:
    """How a claimed batch is settled in its transaction."""

    published: list[str] = field(default_factory=list)
    retry: list[tuple[str, str, float]] = field(default_factory=list)  # id, error, delay_s
    dead: list[tuple[str, str, bool]] = field(default_factory=list)  # id, reason, counted


class ClaimedBatch(Protocol):
    """Rows locked in an open transaction; settle() writes their fate before commit."""

    rows: Sequence[OutboxRow]

    async def settle(self, settlement: Settlement) -> None:
        """Delete or archive published rows, reschedule retries, move dead letters."""


class Store(Protocol):
    """What the worker needs from the database."""

    def claim(self, limit: int) -> AbstractAsyncContextManager[ClaimedBatch]:
        """Open a transaction and lock up to `limit` due rows; commit on clean exit."""

    async def seconds_until_next_due(self) -> float | None:
        """Seconds until the earliest delayed row is due; None when there is none."""


class Publisher(Protocol):
    """What the worker needs from the broker."""

    @property
    def ready(self) -> bool:
        """Connected and not blocked by broker flow control."""

    async def wait_ready(self) -> None:
        """Return once connected and unblocked (reconnecting with backoff as needed)."""

    async def publish(self, messages: Sequence[Message]) -> PublishResult:
        """Publish all messages with confirms pipelined; never raises for one bad message."""


class BatchObserver(Protocol):
    """Told about every settled batch (metrics); must be cheap and must not raise."""

    def observe_batch(
        self,
        rows: Sequence[OutboxRow],
        result: PublishResult,
        settlement: Settlement,
        *,
        publish_s: float,
        batch_s: float,
        confirmed_at: float,
    ) -> None:
        """Record one batch: rows claimed, what the broker said, how they were settled."""

    def loop_woke(self) -> None:
        """The loop woke up (a liveness signal)."""


class NoMetrics:
    """The observer used when metrics are off."""

    def observe_batch(
        self,
        rows: Sequence[OutboxRow],
        result: PublishResult,
        settlement: Settlement,
        *,
        publish_s: float,
        batch_s: float,
        confirmed_at: float,
    ) -> None:
        """Do nothing."""

    def loop_woke(self) -> None:
        """Do nothing."""


@dataclass(frozen=True, slots=True)
class ClaimOptions:
    """How the store claims keyed rows (see relay/settings.py for the knobs)."""

    keys_per_batch: int = 64
    block_on_dead: bool = False
    fence: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> ClaimOptions:
        """The claim options of a relay process."""
        from relay.settings import OnDeadKey, RelayMode

        return cls(
            keys_per_batch=settings.ordering_keys_per_batch,
            block_on_dead=settings.ordering_on_dead is OnDeadKey.BLOCK,
            fence=settings.mode is RelayMode.SINGLE_ACTIVE,
        )
