"""One batch, top to bottom: claim -> build -> publish -> verdicts -> settle -> commit.

The rows stay locked in the claim's transaction from the claim to the commit; the commit is the
moment their fates become durable (a published row is deleted only there, after its own ack).
Every step is bounded by relay/deadlines.py, so the publish ends before the server could
free the rows' locks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from relay.interfaces import (
    Fault,
    Message,
    OutboxRow,
    Publisher,
    PublishResult,
    Reason,
    Store,
    Verdict,
)
from relay.loop import ordering
from relay.loop.retry import RetryPolicy
from relay.loop.verdicts import decide, log_verdicts, to_settlement
from relay.tracing import NO_BATCH, NO_SWEEP, SweepTrace

log = structlog.get_logger("relay.loop.batch")


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What one batch may claim and how long its publish may take."""

    batch_size: int
    publish_budget_s: float
    retry: RetryPolicy
    block_on_dead: bool = False
    max_bytes: int | None = None  # a lane's byte budget (relay/loop/budget.py); None: the store's


@dataclass(slots=True)
class BatchReport:
    """A committed batch: its rows and their verdicts, with timings for the metrics."""

    rows: Sequence[OutboxRow] = ()
    verdicts: list[Verdict] = field(default_factory=list)
    held: int = 0
    publish_s: float = 0.0
    batch_s: float = 0.0
    confirmed_at: float = 0.0
    more_due: bool = False  # the claim stopped at its own bound: more rows may be due

    @property
    def untouched_outside(self) -> bool:
        """Some rows were left for an outside cause (the broker): sweep again once it is back."""
        return any(v.reason in _OUTSIDE for v in self.verdicts)


_OUTSIDE = {Reason.BROKER_LOST, Reason.BLOCKED, Reason.DEADLINE, Reason.SHUTDOWN}


class Stage:
    """How far a lane's batch has come. `sending` from the moment it hands its first message
    to the publisher until the batch ended: only then may the broker have some of its rows,
    and only then must the batch be let finish (rolled back, those rows would go again).
    Before it, the batch is at most a claim in progress (waiting for a pooled connection, a
    new connection's checks, the claim's statement), which a cancel rolls back at no cost: a
    drain whose other lane already failed on a silent server need not wait for it."""

    __slots__ = ("sending",)

    def __init__(self) -> None:
        self.sending = False


def cancel_claiming(running: Iterable[tuple[asyncio.Future[None], Stage]]) -> None:
    """Cancel each task whose batch is not sending (Stage): it holds nothing the broker has."""
    for task, stage in running:
        if not task.done() and not stage.sending:
            task.cancel()


async def run_batch(store: Store, publisher: Publisher, plan: BatchPlan,
                    trace: SweepTrace = NO_SWEEP, stage: Stage | None = None) -> BatchReport:
    """Claim, build, publish, decide, settle and commit one batch (traced as a child of the
    wake-up's `trace` when it finds rows); `stage` says when it starts sending."""
    started = time.perf_counter()
    started_ns = time.time_ns()
    span = NO_BATCH
    try:
        async with store.claim(plan.batch_size, max_bytes=plan.max_bytes) as claim:
            rows = claim.rows
            if not rows:
                await claim.commit()
                return BatchReport(more_due=claim.more_due)
            claimed_ns = time.time_ns()
            more_due = claim.more_due
            deadline = asyncio.get_running_loop().time() + plan.publish_budget_s
            messages, refused = build(publisher, rows)
            span = trace.batch(started_ns, claimed_ns, rows, messages)
            span.event("publish")
            if stage is not None:
                stage.sending = True
            publish_started = time.perf_counter()
            result = await publish(publisher, rows, messages, refused, plan, deadline=deadline)
            publish_s = time.perf_counter() - publish_started
            span.event("confirmed")
            verdicts, held = ordering.hold_back(
                rows, decide(rows, refused, result, plan.retry), block_on_dead=plan.block_on_dead
            )
            await claim.settle(to_settlement(verdicts))
            span.event("settled")
            await claim.commit()
        log_verdicts(verdicts)
    except BaseException as exc:
        span.fail(exc)
        raise
    finally:
        if stage is not None:
            stage.sending = False
    span.finish(verdicts, held)
    return BatchReport(rows, verdicts, held, publish_s, time.perf_counter() - started,
                       time.time(), more_due)


def build(
    publisher: Publisher, rows: Sequence[OutboxRow]
) -> tuple[list[Message], dict[str, Fault]]:
    """Each row's wire form, or the fault that makes it dead at once (a bug included)."""
    messages: list[Message] = []
    refused: dict[str, Fault] = {}
    for row in rows:
        try:
            built = publisher.build(row)
        except Exception as exc:  # a bug in one row's path must not stall the table
            log.exception("row_build_crashed", id=row.id)
            built = Fault(Reason.INTERNAL, f"building the message failed: {exc!r}")
        if isinstance(built, Fault):
            refused[row.id] = built
        else:
            messages.append(built)
    return messages, refused


async def publish(
    publisher: Publisher, rows: Sequence[OutboxRow], messages: list[Message],
    refused: dict[str, Fault], plan: BatchPlan, *, deadline: float,
) -> PublishResult:
    """Publish what the ordering policy lets go now; a crash is pinned on the rows causing it."""
    sendable = ordering.publishable(rows, messages, refused, block_on_dead=plan.block_on_dead)
    if not sendable:
        return PublishResult()
    result = PublishResult()
    try:
        return await ordering.publish_in_waves(publisher, rows, sendable, deadline=deadline,
                                               into=result)
    except Exception:
        log.exception("publish_crashed", count=len(sendable))
    # One message at a time, those a wave before the crash did not settle (a confirmed
    # message sent again is a duplicate): only the rows whose own publish crashes are dead.
    settled = {*result.confirmed, *result.failed, *result.refused, *result.unsent}
    for m in sendable:
        if m.id in settled:
            continue
        try:
            result.merge(await publisher.publish([m], deadline=deadline))
        except Exception as exc:
            result.refused[m.id] = Fault(Reason.INTERNAL, f"publishing failed: {exc!r}")
    return result
