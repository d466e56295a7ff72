"""relay/schedule.py, and the contract with cronsim it relies on (pinned in pyproject.toml and
constraints.txt): five fields or six with seconds first, UTC, an error for a bad field and
StopIteration when no time comes within its look-ahead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import metadata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.schedule import ScheduleError, is_interval, next_cron_time

T0 = datetime(2026, 3, 29, 0, 59, 30, tzinfo=UTC)  # a DST change in Europe: UTC has none


def test_cronsim__the_version_the_relay_was_tested_with() -> None:
    assert metadata.version("cronsim").startswith("2.8")


@pytest.mark.parametrize(("expr", "after", "expected"), [
    ("* * * * *", T0, datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    ("*/5 * * * * *", T0, datetime(2026, 3, 29, 0, 59, 35, tzinfo=UTC)),
    ("0 2 * * *", T0, datetime(2026, 3, 29, 2, 0, tzinfo=UTC)),
    ("0 0 1 JAN *", T0, datetime(2027, 1, 1, tzinfo=UTC)),
    ("0 9 * * MON#1", T0, datetime(2026, 4, 6, 9, 0, tzinfo=UTC)),
    ("0 0 L * *", T0, datetime(2026, 3, 31, tzinfo=UTC)),
])
def test_next_cron_time__utc_five_or_six_fields(expr: str, after: datetime,
                                                expected: datetime) -> None:
    assert next_cron_time(expr, after) == expected


def test_next_cron_time__a_time_in_another_zone_is_read_as_the_same_instant() -> None:
    paris = T0.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris"))
    assert next_cron_time("* * * * *", paris) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


@pytest.mark.parametrize(("expr", "says"), [
    ("61 * * * *", "Bad minute"),
    ("* * *", "Wrong number of fields"),
    ("* * */20 * 1L", "no time in the next 50 years"),
])
def test_next_cron_time__no_next_time_says_why(expr: str, says: str) -> None:
    with pytest.raises(ScheduleError, match=says):
        next_cron_time(expr, T0)


@pytest.mark.parametrize(("repeat", "interval"), [
    ("PT30S", True), (" pt1s", True), ("P1D", True), ("*/5 * * * *", False), ("0 0 * * *", False),
])
def test_is_interval(repeat: str, interval: bool) -> None:
    assert is_interval(repeat) is interval


@given(st.integers(0, 59), st.datetimes(min_value=datetime(2000, 1, 1),
                                       max_value=datetime(2090, 1, 1), timezones=st.just(UTC)))
def test_next_cron_time__strictly_after_and_within_the_period(minute: int,
                                                               after: datetime) -> None:
    nxt = next_cron_time(f"{minute} * * * *", after)
    assert after < nxt <= after + timedelta(hours=1)
    assert (nxt.minute, nxt.second) == (minute, 0)
