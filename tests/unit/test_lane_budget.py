"""A lane's byte budget follows its batches: after a missed deadline, half of what the
batch had confirmed, down to a floor; doubled back after a quick publish, up to the setting."""

from __future__ import annotations

from relay.interfaces import Kind, OutboxRow, Reason, Verdict
from relay.loop.batch import BatchReport
from relay.loop.budget import FLOOR_BYTES, LaneBytes, confirmed_bytes

ROW = OutboxRow("id1", "x", "rk", b"{}", None, 0)


def _report(*, missed: bool, publish_s: float) -> BatchReport:
    verdict = (Verdict("id1", Kind.UNTOUCHED, Reason.DEADLINE) if missed
               else Verdict("id1", Kind.PUBLISHED))
    return BatchReport(rows=[ROW], verdicts=[verdict], publish_s=publish_s)


def test_lane_bytes__a_missed_deadline_leaves_half_of_what_was_confirmed_then_grows_back() -> None:
    budget = LaneBytes(24 << 20, publish_budget_s=15.0)
    assert budget.now == 24 << 20
    # 3 MiB of 24 confirmed by the deadline: the link carries about that per budget.
    budget.after(_carried(confirmed=3, untouched=21, kib=1024))
    assert budget.now == (3 << 20) // 2
    # Most of a small batch confirmed: at most half of the budget before.
    budget.after(_carried(confirmed=3, untouched=1, kib=1024))
    assert budget.now == (3 << 20) // 4
    for _ in range(20):
        budget.after(_report(missed=True, publish_s=15.0))  # nothing confirmed
    assert budget.now == FLOOR_BYTES
    budget.after(_report(missed=False, publish_s=5.0))  # in time, but not quick: stays
    assert budget.now == FLOOR_BYTES
    budget.after(_report(missed=False, publish_s=1.0))
    assert budget.now == 2 * FLOOR_BYTES
    for _ in range(20):
        budget.after(_report(missed=False, publish_s=0.01))
    assert budget.now == 24 << 20


def test_confirmed_bytes__count_content_and_options_of_published_rows_only() -> None:
    rows = [OutboxRow("a", "x", "rk", b"12345", '{"h":1}', 0),
            OutboxRow("b", "x", "rk", "\u00e9", None, 0),
            OutboxRow("c", "x", "rk", b"0" * 100, None, 0)]
    verdicts = [Verdict("a", Kind.PUBLISHED), Verdict("b", Kind.PUBLISHED),
                Verdict("c", Kind.UNTOUCHED, Reason.DEADLINE)]
    assert confirmed_bytes(rows, verdicts) == 5 + 7 + 2


def _carried(*, confirmed: int, untouched: int, kib: int) -> BatchReport:
    """A batch of rows of `kib` KiB each that missed its deadline with `confirmed` of them
    published."""
    rows = [OutboxRow(f"r{i}", "x", "rk", b"0" * (kib << 10), None, 0)
            for i in range(confirmed + untouched)]
    verdicts = [Verdict(r.id, Kind.PUBLISHED) if i < confirmed
                else Verdict(r.id, Kind.UNTOUCHED, Reason.DEADLINE) for i, r in enumerate(rows)]
    return BatchReport(rows=rows, verdicts=verdicts, publish_s=15.0)


def test_lane_bytes__an_empty_batch_changes_nothing_and_a_tiny_setting_is_its_own_floor() -> None:
    budget = LaneBytes(1000, publish_budget_s=15.0)
    budget.after(BatchReport())
    assert budget.now == 1000
    budget.after(_report(missed=True, publish_s=15.0))
    assert budget.now == 1000
