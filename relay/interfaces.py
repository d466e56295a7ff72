"""The small seams between the worker and its drivers: rows, messages, outcomes, protocols."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Protocol

from relay.options import Properties


class OnSuccess(StrEnum):
    """What happens to a row once the broker confirmed it (RELAY_ON_SUCCESS)."""

    DELETE = "delete"
    ARCHIVE = "archive"


class OutboxRow(NamedTuple):
    """One claimed row, as the store hands it to the worker.

    exchange, routing_key and content may be NULL in a table of the classic shape (no NOT NULL
    constraints); the worker dead-letters such rows instead of failing on them.
    """

    id: str
    exchange: str | None
    routing_key: str | None
    content: bytes | str | None  # the store hands UTF-8 bytes: the body as it is
    options: str | None
    attempts: int
    created_at_s: float | None = None  # epoch seconds (database clock), for the age metric
    ordering_key: str | None = None
    # Bytes of content the claim left in the database (over RELAY_MAX_MESSAGE_BYTES); content
    # is then None and the row is parked as too large.
    withheld: int | None = None
    # A recurring row (docs/recurring.md): its schedule, and the time this occurrence was due
    # (epoch seconds, database clock).
    repeat: str | None = None
    occurrence_s: float | None = None


@dataclass(slots=True)
class Message:
    """One AMQP publish. The row id always travels in the relay's own header (x-outbox-id), and
    as message_id unless the producer chose one."""

    id: str
    exchange: str
    routing_key: str
    body: bytes
    properties: Properties
    mandatory: bool
    checked: bool = False  # built by the publisher's encoder: known encodable


class Reason(StrEnum):
    """Why a row did not leave its batch as published: the bounded code logs and metrics read."""

    # The row's own fault, found before sending: dead at once.
    INVALID_ROW = "invalid_row"  # NULL content or exchange
    INVALID_OPTION = "invalid_option"  # options the relay does not know or cannot map
    INVALID_REPEAT = "invalid_repeat"  # a recurring row whose schedule has no next time
    ENCODE_ERROR = "encode_error"  # AMQP cannot carry it (short string too long, header type)
    TOO_LARGE = "too_large"  # body over RELAY_MAX_MESSAGE_BYTES, properties over a frame
    FORBIDDEN = "forbidden"  # the broker would close the channel for it (a foreign userId)
    # The broker refused the row: retried with an attempt counted, dead after the limit.
    UNROUTABLE = "unroutable"
    NACKED = "nacked"
    EXCHANGE_NOT_FOUND = "exchange_not_found"
    CHANNEL_CLOSED_BY_ROW = "channel_closed_by_row"
    DESTINATION_REFUSED = "destination_refused"  # its exchange closed the probe channel lately
    CONFIRM_TIMEOUT = "confirm_timeout"
    # A bug in the relay's path for this row: dead at once, with a log line.
    INTERNAL = "internal"
    # Outside causes: the row is left untouched, no attempt counted.
    BROKER_LOST = "broker_lost"
    BLOCKED = "blocked"
    DEADLINE = "deadline"
    SHUTDOWN = "shutdown"
    HELD = "held"  # ordering: a row after its key's unpublished row
    # Its destination stopped confirming (a quorum queue without its majority): due again after
    # the destination's backoff, no attempt counted (relay/amqp/destinations.py).
    DESTINATION_SILENT = "destination_silent"


@dataclass(frozen=True, slots=True)
class Fault:
    """A reason code and the text a person reads (it names the field, exchange or key)."""

    reason: Reason
    text: str

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.text}"


@dataclass(slots=True)
class PublishResult:
    """What became of a batch of publishes, per message.

    confirmed: acked by the broker for exactly that message and not returned; failed: the
    broker refused the message (its own fault, an attempt is counted); refused: it can never be
    published as it is (dead at once); unsent: its fate is unknown for a cause outside the row
    (connection lost, flow control, deadline), so the row is left as it was; postponed: not
    sent because its destination stopped confirming, due again after the delay (seconds), no
    attempt counted.
    """

    confirmed: list[str] = field(default_factory=list)
    failed: dict[str, Fault] = field(default_factory=dict)
    refused: dict[str, Fault] = field(default_factory=dict)
    unsent: dict[str, Reason] = field(default_factory=dict)
    postponed: dict[str, tuple[Fault, float]] = field(default_factory=dict)

    def merge(self, other: PublishResult) -> None:
        """Add another result (of a later wave of the same batch) to this one."""
        self.confirmed.extend(other.confirmed)
        self.failed.update(other.failed)
        self.refused.update(other.refused)
        self.unsent.update(other.unsent)
        self.postponed.update(other.postponed)


class Kind(StrEnum):
    """The four fates of a claimed row."""

    PUBLISHED = "published"  # the broker acked exactly this message, and did not return it
    RETRY = "retry"  # published again after a delay; an attempt counted (the row's fault)
    DEAD = "dead"  # moved to the dead-letter table
    UNTOUCHED = "untouched"  # left as it was for an outside cause; no attempt counted


@dataclass(frozen=True, slots=True)
class Verdict:
    """One claimed row's fate in its batch: every claimed row gets exactly one."""

    row_id: str
    kind: Kind
    reason: Reason | None = None
    text: str = ""
    delay_s: float = 0.0  # retry: how long until the row is due again
    counted: bool = False  # an attempt was counted against the row

    @property
    def code(self) -> str:
        """The reason code, or the kind for a published row (a bounded metrics label)."""
        return self.kind.value if self.reason is None else self.reason.value


@dataclass(slots=True)
class Settlement:
    """How a claimed batch is written in its transaction (the store's view of the verdicts)."""

    published: list[str] = field(default_factory=list)
    # id, error, delay_s, whether an attempt is counted
    retry: list[tuple[str, str, float, bool]] = field(default_factory=list)
    dead: list[tuple[str, str, bool]] = field(default_factory=list)  # id, reason, counted


class ClaimedBatch(Protocol):
    """Rows locked in an open transaction; settle() writes their fate, commit() ends it.

    Leaving the claim block without commit() rolls the transaction back.
    """

    rows: Sequence[OutboxRow]
    # The claim stopped at its own bound (the byte budget, the single-active walk), not at
    # the backlog's end: more rows may be due, claim again at once.
    more_due: bool

    async def settle(self, settlement: Settlement) -> None:
        """Delete or archive published rows, reschedule retries, move dead letters."""

    async def commit(self) -> None:
        """Commit the claim's transaction: the settled fates become durable here."""


class Store(Protocol):
    """What the worker needs from the database."""

    def claim(self, limit: int, *, max_bytes: int | None = None
              ) -> AbstractAsyncContextManager[ClaimedBatch]:
        """Open a transaction and lock up to `limit` due rows (and about `max_bytes` of them,
        when less than the store's own byte budget); roll back unless committed."""

    async def seconds_until_next_due(self) -> float | None:
        """Seconds until the earliest delayed row is due; None when there is none."""


@dataclass(frozen=True, slots=True)
class LockState:
    """What the wake-up lock session (relay/pg/wakeup.py) knows, for the sleeper to decide on
    (relay/loop/sleep.py). Nothing here is a decision.

    role: "sleeper" (this relay sleeps holding the lock), "waiter" (another relay does), None
    (no session, or not decided yet). mode: the notify mode installed on the table, as the
    sleeper last read it (None: unknown). held: the wake-up lock is held, so producers notify.
    pending: the request for it is queued, not granted yet. checked: due_now and next_due_s
    were read in a snapshot taken after the lock was granted (or tried).
    """

    role: str | None = None
    mode: str | None = None
    held: bool = False
    pending: bool = False
    checked: bool = False
    due_now: bool = False
    next_due_s: float | None = None


class WakeupLock(Protocol):
    """The database's side of the conditional wake-up (docs/notify.md): the lock and the check.
    Every decision about sleeping is the sleeper's (relay/loop/sleep.py)."""

    async def prepare(self, woken: asyncio.Event, *, queue: bool) -> LockState:
        """As the table's sleeper: read the mode and take the lock, queueing for it (a slice
        of waiting at a time; it stays queued across calls) or, with `queue` False, only if
        no producer holds it; once held (or tried), read whether rows are due and when the
        next delayed one is. Nothing while the lock is held or `woken` is set."""

    def state(self) -> LockState:
        """What is known now, without a statement."""

    async def release(self) -> None:
        """Release the lock if held (producers stop notifying), without waiting."""

    async def step_down(self) -> None:
        """This relay cannot publish now: end the session, so a replica that can takes the
        sleeper role."""

    async def close(self) -> None:
        """Release everything (stop)."""


# Batches of the express lane in flight at once (relay/loop/express.py): a batch waits for its
# broker confirm (a disk write, several milliseconds while a drain loads the broker), and a row
# committed meanwhile should not wait for it. Each holds a database connection while it runs.
EXPRESS_IN_FLIGHT = 3


class Newest(NamedTuple):
    """What the express lane's look sees."""

    xact: int | None  # the newest transaction newer than asked that has rows (None: none)
    running_from: int  # the oldest transaction still running: every older one has ended


class ExpressStore(Store, Protocol):
    """The store as the express lane needs it (relay/loop/express.py): its claims take the
    fair round alone, of the transactions newer than `after` (None: all)."""

    after: int | None

    floor: int | None

    async def newest_transaction(self, newer_than: int = 0) -> Newest:
        """The newest transaction newer than `newer_than` that has unkeyed rows in the outbox,
        and the oldest one still running."""


class Publisher(Protocol):
    """What the worker needs from the broker."""

    @property
    def ready(self) -> bool:
        """Connected and not blocked by broker flow control."""

    @property
    def connected(self) -> bool:
        """The connection is open (blocked or not)."""

    async def wait_ready(self) -> None:
        """Return once connected and unblocked (reconnecting with backoff as needed)."""

    def build(self, row: OutboxRow) -> Message | Fault:
        """The row's wire form, or why the broker would refuse it (dead at once)."""

    async def publish(
        self, messages: Sequence[Message], *, deadline: float | None = None
    ) -> PublishResult:
        """Publish all messages with confirms pipelined, ending by `deadline` (loop time).

        Every message comes back in exactly one field of the result; it never raises for one
        bad message.
        """


class BatchObserver(Protocol):
    """Told about every settled batch (metrics); must be cheap and must not raise."""

    def observe_batch(
        self,
        rows: Sequence[OutboxRow],
        verdicts: Sequence[Verdict],
        *,
        publish_s: float,
        batch_s: float,
        confirmed_at: float,
    ) -> None:
        """Record one committed batch: its rows and their verdicts."""

    def loop_woke(self) -> None:
        """The loop woke up (a liveness signal)."""


class NoMetrics:
    """The observer used when metrics are off."""

    def observe_batch(
        self,
        rows: Sequence[OutboxRow],
        verdicts: Sequence[Verdict],
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
    max_bytes: int = 24 * 1024 * 1024  # content and options of one batch (RELAY_BATCH_MAX_BYTES)
    # Content over this stays in the database; the row comes with its size (RELAY_MAX_MESSAGE_BYTES)
    max_message_bytes: int = 16 * 1024 * 1024
