"""When a recurring row is due again (docs/recurring.md).

A row's `repeat` is either an ISO 8601 interval (`PT30S`, `P1D`, `P1DT12H`: at least one
second), counted from each publish and computed by PostgreSQL in the settle itself, or a cron
expression in UTC: five fields (minute, hour, day of month, month, day of week) or six with
seconds first, as Debian's cron reads them (cronsim). The next time of a cron row is the first
one after the settle: an outage that missed occurrences publishes one catch-up, then the
schedule goes on from now. The database refuses an expression it cannot read at INSERT (the
table's CHECK, sql/migrations/0015_recurring.sql); one that it accepts but that has no time in
the next 50 years (`* * */20 * 1L`) is parked at its first settle with the reason.
"""

from __future__ import annotations

from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

# How far cronsim looks for a next time before it gives up (its own bound).
LOOKAHEAD_YEARS = 50


class ScheduleError(ValueError):
    """The expression has no next time."""


def is_interval(repeat: str) -> bool:
    """An ISO 8601 interval (PostgreSQL computes its next time), not a cron expression."""
    return repeat.lstrip(" \t").upper().startswith("P")


def next_cron_time(repeat: str, after: datetime) -> datetime:
    """The first time of the cron expression strictly after `after` (UTC)."""
    start = after.astimezone(UTC).replace(tzinfo=None)
    try:
        nxt = next(CronSim(repeat, start))
    except CronSimError as exc:
        raise ScheduleError(f"cron expression {repeat!r}: {exc}") from None
    except StopIteration:
        raise ScheduleError(f"cron expression {repeat!r} has no time in the next "
                            f"{LOOKAHEAD_YEARS} years") from None
    return nxt.replace(tzinfo=UTC)
