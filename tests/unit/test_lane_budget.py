"""A lane's byte budget follows its batches: halved after a missed deadline, down to a
floor; doubled back after a quick publish, up to the setting."""

from __future__ import annotations

from relay.interfaces import Kind, OutboxRow, Reason, Verdict
from relay.loop.batch import BatchReport
from relay.loop.budget import FLOOR_BYTES, LaneBytes

ROW = OutboxRow("id1", "x", "rk", b"{}", None, 0)


def _report(*, missed: bool, publish_s: float) -> BatchReport:
    verdict = (Verdict("id1", Kind.UNTOUCHED, Reason.DEADLINE) if missed
               else Verdict("id1", Kind.PUBLISHED))
    return BatchReport(rows=[ROW], verdicts=[verdict], publish_s=publish_s)


def test_lane_bytes__halve_on_a_missed_deadline_down_to_the_floor_and_grow_back() -> None:
    budget = LaneBytes(24 << 20, publish_budget_s=15.0)
    assert budget.now == 24 << 20
    budget.after(_report(missed=True, publish_s=15.0))
    assert budget.now == 12 << 20
    for _ in range(20):
        budget.after(_report(missed=True, publish_s=15.0))
    assert budget.now == FLOOR_BYTES
    budget.after(_report(missed=False, publish_s=5.0))  # in time, but not quick: stays
    assert budget.now == FLOOR_BYTES
    budget.after(_report(missed=False, publish_s=1.0))
    assert budget.now == 2 * FLOOR_BYTES
    for _ in range(20):
        budget.after(_report(missed=False, publish_s=0.01))
    assert budget.now == 24 << 20


def test_lane_bytes__an_empty_batch_changes_nothing_and_a_tiny_setting_is_its_own_floor() -> None:
    budget = LaneBytes(1000, publish_budget_s=15.0)
    budget.after(BatchReport())
    assert budget.now == 1000
    budget.after(_report(missed=True, publish_s=15.0))
    assert budget.now == 1000
