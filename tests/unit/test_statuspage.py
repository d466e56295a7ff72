"""The status page's HTML: every figure shown, every value escaped."""

from __future__ import annotations

from relay.ops.statuspage import render


def test_render__escapes_reasons_and_names_every_figure() -> None:
    doc = {"table": "app.outbox", "due": 12345, "oldest_due_age_s": 400.0, "in_per_s": 10.0,
           "out_per_s": 5.0, "eta_s": None, "dead": 2, "relays": 0, "notify_mode": "off",
           "delayed": 1, "retrying": 0, "dead_by_reason": {"<script>alert(1)</script>": 2}}
    page = render(doc)
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for text in ("12,345", "6.7 min", "10/s / 5/s", "not draining", "app.outbox", ">off<"):
        assert text in page, text
    assert page.count("card warn") == 3  # old backlog, dead letters, no relay connected
