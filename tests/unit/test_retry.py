"""Settlement planning and backoff, without servers."""

from __future__ import annotations

import random

from relay.interfaces import OutboxRow, PublishResult
from relay.loop.retry import RetryPolicy, plan_settlement
from relay.loop.worker import build_messages

POLICY = RetryPolicy(max_attempts=3, base_s=1.0, max_s=10.0)


def row(i: str, attempts: int = 0, options: str | None = None, content: str = "{}") -> OutboxRow:
    return OutboxRow(i, "x", "rk", content, options, attempts)


def test_delay__doubles_per_attempt_with_jitter_and_is_capped() -> None:
    rng = random.Random(1)
    for attempts, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (30, 10.0)]:
        for _ in range(50):
            d = POLICY.delay_s(attempts, rng)
            assert ceiling / 2 <= d <= ceiling


def test_plan__confirmed_rows_are_published_and_failures_retried_then_dead() -> None:
    rows = [row("a"), row("b"), row("c", attempts=2), row("d")]
    result = PublishResult(confirmed=["a"], failed={"b": "nacked", "c": "nacked"}, unsent=["d"])
    plan = plan_settlement(rows, result, {}, POLICY)
    assert plan.published == ["a"]
    assert [(i, e) for i, e, _ in plan.retry] == [("b", "nacked")]
    assert plan.dead == [("c", "gave up after 3 attempts: nacked", True)]
    # d's fate is unknown (connection lost): left untouched, no attempt counted
    assert all("d" not in (x[0] for x in part) for part in (plan.retry, plan.dead))


def test_plan__invalid_rows_go_straight_to_dead_letters_uncounted() -> None:
    plan = plan_settlement([row("a")], PublishResult(), {"a": "options.x: unknown option"}, POLICY)
    assert plan.dead == [("a", "options.x: unknown option", False)]


def test_build_messages__rejects_bad_options_and_oversize_bodies_keeps_the_rest() -> None:
    rows = [row("ok"), row("bad", options='{"nope": 1}'), row("big", content='"' + "x" * 100 + '"')]
    messages, invalid = build_messages(rows, mandatory=True, max_message_bytes=50)
    assert [m.id for m in messages] == ["ok"]
    assert messages[0].body == b"{}"
    assert messages[0].mandatory
    assert "options.nope" in invalid["bad"]
    assert "exceeds the maximum message size" in invalid["big"]
