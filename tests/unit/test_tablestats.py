"""When a relay asks for the outbox's statistics to be refreshed (relay/pg/tablestats.py): after
a full claim that followed a short one, once per interval, again after a busy lock, and never
on a trickle of short claims. A fake session stands for the server (the function itself is
tested against PostgreSQL in tests/integration/test_cold_plans.py)."""

from __future__ import annotations

from typing import Any

import pytest

from relay.pg import tablestats
from relay.pg.queries import Queries, TableNames
from relay.pg.tablestats import TableStatistics

Q = Queries(TableNames(None, "queue_message", "queue_message_notify"))


class Session:
    """Answers the refresh with what it is given, and notes each call's rows."""

    def __init__(self, *answers: bool | None) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []

    async def fetchval(self, sql: str, rows: int) -> Any:
        assert sql == Q["refresh_statistics"]
        self.asked.append(rows)
        return self.answers.pop(0) if self.answers else False


async def _claims(stats: TableStatistics, session: Session, *taken: int, limit: int = 500,
                  ) -> None:
    for rows in taken:
        stats.claimed(rows, rows >= limit)
        await stats.refresh_if_due(session, Q)


async def test_tablestats__a_trickle_of_short_claims_never_asks() -> None:
    stats, session = TableStatistics(), Session()
    await _claims(stats, session, 1, 0, 3, 499, 0)
    assert session.asked == []


async def test_tablestats__the_first_full_claim_after_short_ones_asks_once() -> None:
    stats, session = TableStatistics(min_interval_s=0), Session(True)
    await _claims(stats, session, 1, 500, 500, 500)
    assert session.asked == [500]
    assert stats.refreshed == 1
    await _claims(stats, session, 0, 500)  # a new backlog: asks again
    assert session.asked == [500, 500]


async def test_tablestats__within_the_interval_a_new_backlog_does_not_ask_again() -> None:
    stats, session = TableStatistics(min_interval_s=3600), Session(True)
    await _claims(stats, session, 500, 0, 500, 0, 500)
    assert session.asked == [500]


async def test_tablestats__a_busy_lock_is_asked_again_a_second_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(tablestats.time, "monotonic", lambda: now[0])
    stats, session = TableStatistics(min_interval_s=0), Session(None, None, True)
    await _claims(stats, session, 0, 500, 500, 500)
    assert session.asked == [500], "a busy lock is not asked for at every claim"
    now[0] += tablestats.RETRY_S
    await _claims(stats, session, 500, 500)
    assert session.asked == [500, 500]
    now[0] += tablestats.RETRY_S
    await _claims(stats, session, 500, 500)
    assert session.asked == [500, 500, 500]
    assert stats.refreshed == 1
