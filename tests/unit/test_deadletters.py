"""Argument parsing of the dead-letter and retention commands."""

from __future__ import annotations

import pytest

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
