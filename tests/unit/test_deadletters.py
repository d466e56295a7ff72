"""Argument parsing of the dead-letter and retention commands."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relay.pg.deadletters import UsageError, check_ids, parse_duration_s


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800.0), ("12h", 43200.0), ("30m", 1800.0), ("45s", 45.0), ("2w", 1209600.0),
     ("90", 90.0), ("1.5h", 5400.0)],
)
def test_parse_duration_s__accepts_units(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "7 days", "-1d", "d", "7y"])
def test_parse_duration_s__rejects_nonsense(text: str) -> None:
    with pytest.raises(UsageError):
        parse_duration_s(text)


def test_check_ids__rejects_what_is_not_a_uuid() -> None:
    with pytest.raises(UsageError, match="not-a-uuid"):
        check_ids(["0b8e7a52-6a3c-4c57-9f0e-8f1f4b6f2d10", "not-a-uuid"])


def test_parse_since__an_age_or_a_time_utc_unless_it_says() -> None:
    from datetime import UTC, datetime, timedelta

    from relay.cli.dead import parse_since

    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("2026-11-26T09:00:00+01:00", now) == datetime(2026, 11, 26, 8, 0,
                                                                      tzinfo=UTC)
    assert parse_since("2026-11-26 09:00", now) == datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
    with pytest.raises(UsageError, match="--since"):
        parse_since("yesterday-ish", now)


@given(st.text(max_size=40))
@example("64000000000")  # an age before the year 1: found by this test
@example("9" * 30 + "d")
def test_parse_since__any_text_is_a_time_or_a_usage_error(text: str) -> None:
    """Whatever a user types after --since: an aware time, or a UsageError naming the option
    (never another exception, which would print a traceback)."""
    from datetime import UTC, datetime

    from relay.cli.dead import parse_since

    refused = ""
    try:
        when = parse_since(text, datetime(2026, 11, 26, 12, 0, tzinfo=UTC))
    except UsageError as exc:
        refused = str(exc)
    if refused:
        assert "--since" in refused
    else:
        assert when.tzinfo is not None
