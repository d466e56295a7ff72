"""tests/timeline.py: a worker's tests become the units it ran, in order, and the summary says
who sat idle at the end."""

from __future__ import annotations

from pathlib import Path

from tests.timeline import report, spans


def test_timeline__units_in_order_and_the_idle_tail(tmp_path: Path) -> None:
    (tmp_path / "gw0.tsv").write_text(
        "100.0\t130.0\ttests/chaos/test_a.py::one\n"
        "130.0\t160.0\ttests/chaos/test_a.py::two\n"
        "160.0\t161.0\ttests/spark/test_write_outbox.py::x\n"
        "161.0\t200.0\ttests/spark/test_streaming.py::y\n")
    (tmp_path / "gw1.tsv").write_text("100.0\t150.0\ttests/unit/test_b.py::one\n")
    units = spans(tmp_path / "gw0.tsv")
    assert [(u.unit, u.end - u.start, u.tests) for u in units] == [
        ("tests/chaos/test_a.py", 60.0, 2),
        ("tests/spark (the local Spark session's modules)", 40.0, 2)]
    text = report(tmp_path)
    assert "100 s from the first test's start" in text
    assert "gw1: 1 units, busy 50 s, done at 50 s (idle 50 s at the end)" in text
