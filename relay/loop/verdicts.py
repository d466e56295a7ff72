"""A verdict per claimed row, decided from what was built and what the broker said.

Every claimed row leaves its batch with exactly one Verdict (relay/interfaces.py): published,
retry (an attempt counted: the row's own fault), dead (a reason code and text), or untouched
(an outside cause; no attempt counted). Logs and metrics read the reason codes; a batch logs one
line per (fate, reason) with a count, never one line per row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import structlog

from relay.interfaces import (
    Fault,
    Kind,
    OutboxRow,
    PublishResult,
    Reason,
    Settlement,
    Verdict,
)
from relay.loop.retry import RetryPolicy

log = structlog.get_logger("relay.loop.verdicts")

INT_MAX = 2**31 - 1  # attempts is a PostgreSQL integer that producers may write

__all__ = ["Kind", "Reason", "Verdict", "decide", "log_verdicts", "to_settlement"]


def decide(
    rows: Sequence[OutboxRow],
    refused: Mapping[str, Fault],
    result: PublishResult,
    policy: RetryPolicy,
) -> list[Verdict]:
    """One verdict per row, in row order.

    refused: rows the encoder (or the relay's own path) refused before sending.
    """
    confirmed = set(result.confirmed)
    verdicts = []
    for row in rows:
        fault = refused.get(row.id) or result.refused.get(row.id)
        if fault is not None:
            verdicts.append(Verdict(row.id, Kind.DEAD, fault.reason, fault.text))
        elif row.id in confirmed:
            verdicts.append(Verdict(row.id, Kind.PUBLISHED))
        elif (failure := result.failed.get(row.id)) is not None:
            verdicts.append(_retry_or_dead(row, failure, policy))
        elif (postponed := result.postponed.get(row.id)) is not None:
            fault, delay_s = postponed
            verdicts.append(Verdict(row.id, Kind.RETRY, fault.reason, fault.text,
                                    delay_s=delay_s, counted=False))
        else:
            # Unsent for an outside cause, or never sent (the ordering policy held it back).
            verdicts.append(Verdict(row.id, Kind.UNTOUCHED, result.unsent.get(row.id, Reason.HELD)))
    return verdicts


def _retry_or_dead(row: OutboxRow, failure: Fault, policy: RetryPolicy) -> Verdict:
    attempts = min(row.attempts, INT_MAX - 1) + 1  # the column is an integer: its count stops
    if attempts >= policy.max_attempts:
        return Verdict(row.id, Kind.DEAD, failure.reason,
                       f"gave up after {attempts} attempts: {failure}", counted=True)
    return Verdict(row.id, Kind.RETRY, failure.reason, failure.text,
                   delay_s=policy.delay_s(attempts), counted=True)


def to_settlement(verdicts: Sequence[Verdict]) -> Settlement:
    """The store's writes for the verdicts (untouched rows need none)."""
    settlement = Settlement()
    for v in verdicts:
        if v.kind is Kind.PUBLISHED:
            settlement.published.append(v.row_id)
        elif v.kind is Kind.RETRY:
            settlement.retry.append((v.row_id, f"{v.code}: {v.text}", v.delay_s, v.counted))
        elif v.kind is Kind.DEAD:
            text = v.text if v.counted else f"{v.code}: {v.text}"
            settlement.dead.append((v.row_id, text, v.counted))
    return settlement


_LEVELS = {Kind.DEAD: "warning", Kind.RETRY: "info", Kind.UNTOUCHED: "info"}


def log_verdicts(verdicts: Sequence[Verdict]) -> None:
    """One line per (fate, reason) in the batch, with a count and one example row."""
    groups: dict[tuple[Kind, str], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        if v.kind is not Kind.PUBLISHED and v.reason is not Reason.HELD:
            groups[(v.kind, v.code)].append(v)
    for (kind, code), group in groups.items():
        first = group[0]
        level = "error" if first.reason is Reason.INTERNAL else _LEVELS[kind]
        getattr(log, level)(f"rows_{kind.value}", reason=code, count=len(group),
                            example_id=first.row_id, example=first.text[:300] or None)
