"""How many bytes a batch claims: less after a batch that missed its deadline.

A batch's publish has a budget (relay/deadlines.py). On a link slower than a full batch per
budget (RELAY_BATCH_MAX_BYTES in RELAY_PUBLISH_TIMEOUT_S, about 1.6 MB/s per lane with the
defaults), every batch would miss it: the part that went out is confirmed and kept, the rest
waits, and the next full batch misses again. So the worker's lanes (they share the broker
link) halve their byte budget after a batch that missed its deadline, down to FLOOR_BYTES
(the first row of a claim always goes), and double it back, up to the setting, after a
batch that published within a quarter of the budget: a slow link drains at the link's
speed, a fast one at full batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.interfaces import Reason
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
        """Follow one committed batch: halve after a missed deadline, double after a quick
        publish."""
        if any(v.reason is Reason.DEADLINE for v in report.verdicts):
            self.now = max(min(FLOOR_BYTES, self.ceiling), self.now // 2)
        elif report.rows and report.publish_s < self.publish_budget_s / 4:
            self.now = min(self.ceiling, self.now * 2)
