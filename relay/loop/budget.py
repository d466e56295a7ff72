"""How many bytes a batch claims: what the link carried within a batch's budget.

A batch's publish has a budget (relay/deadlines.py). On a link slower than a full batch per
budget (RELAY_BATCH_MAX_BYTES in RELAY_PUBLISH_TIMEOUT_S), the part that was confirmed is kept
and the rest waits; the transport writes no more than it can have confirmed in time
(relay/amqp/pacing.py), so what waits was not sent. So that the next batches fit, the worker's
lanes (they share the broker link) claim, after a batch that missed its deadline, half of what
that batch had confirmed (and at most half of the budget before), down to FLOOR_BYTES (the
first row of a claim always goes); they double it back, up to the setting, after a batch that
published within a quarter of the budget: a slow link drains at the link's speed, a fast one
at full batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from relay.interfaces import Kind, OutboxRow, Reason, Verdict
from relay.loop.batch import BatchReport

FLOOR_BYTES = 64 * 1024


@dataclass
class LaneBytes:
    """The lanes' byte budget per claim, between FLOOR_BYTES and `ceiling`."""

    ceiling: int
    publish_budget_s: float
    now: int = field(init=False)

    def __post_init__(self) -> None:
        self.now = self.ceiling

    def after(self, report: BatchReport) -> None:
        """Follow one committed batch: after a missed deadline, half of what it had
        confirmed; after a quick publish, double."""
        if any(v.reason is Reason.DEADLINE for v in report.verdicts):
            carried = confirmed_bytes(report.rows, report.verdicts)
            self.now = max(min(FLOOR_BYTES, self.ceiling), min(self.now, carried) // 2)
        elif report.rows and report.publish_s < self.publish_budget_s / 4:
            self.now = min(self.ceiling, self.now * 2)


def confirmed_bytes(rows: Sequence[OutboxRow], verdicts: Sequence[Verdict]) -> int:
    """Content and options of the rows the broker confirmed, as the claim counts them."""
    published = {v.row_id for v in verdicts if v.kind is Kind.PUBLISHED}
    return sum(_size(r.content) + _size(r.options) for r in rows if r.id in published)


def _size(value: bytes | str | None) -> int:
    if value is None:
        return 0
    return len(value) if isinstance(value, bytes) else len(value.encode())
