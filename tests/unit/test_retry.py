"""Verdicts and backoff, without servers."""

from __future__ import annotations

import random

from relay.interfaces import Fault, Kind, OutboxRow, PublishResult, Reason
from relay.loop.retry import RetryPolicy
from relay.loop.verdicts import decide, to_settlement

POLICY = RetryPolicy(max_attempts=3, base_s=1.0, max_s=10.0)
NACKED = Fault(Reason.NACKED, "nacked by the broker")


def row(i: str, attempts: int = 0) -> OutboxRow:
    return OutboxRow(i, "x", "rk", "{}", None, attempts)


def test_delay__doubles_per_attempt_with_jitter_and_is_capped() -> None:
    rng = random.Random(1)
    for attempts, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (30, 10.0)]:
        for _ in range(50):
            d = POLICY.delay_s(attempts, rng)
            assert ceiling / 2 <= d <= ceiling


def test_decide__every_row_gets_exactly_one_verdict() -> None:
    rows = [row("a"), row("b"), row("c", attempts=2), row("d"), row("e"), row("f")]
    result = PublishResult(confirmed=["a"], failed={"b": NACKED, "c": NACKED},
                           unsent={"d": Reason.BROKER_LOST},
                           refused={"e": Fault(Reason.FORBIDDEN, "options.userId")})
    verdicts = decide(rows, {}, result, POLICY)
    assert [v.row_id for v in verdicts] == ["a", "b", "c", "d", "e", "f"]
    fates = {v.row_id: (v.kind, v.reason, v.counted) for v in verdicts}
    assert fates == {
        "a": (Kind.PUBLISHED, None, False),
        "b": (Kind.RETRY, Reason.NACKED, True),
        "c": (Kind.DEAD, Reason.NACKED, True),  # third attempt: gave up
        "d": (Kind.UNTOUCHED, Reason.BROKER_LOST, False),  # not the row's fault: no attempt
        "e": (Kind.DEAD, Reason.FORBIDDEN, False),
        "f": (Kind.UNTOUCHED, Reason.HELD, False),  # never sent (ordering held it back)
    }


def test_decide__a_row_refused_at_build_is_dead_at_once_uncounted_with_its_code() -> None:
    fault = Fault(Reason.INVALID_OPTION, "options.x: unknown option")
    verdicts = decide([row("a")], {"a": fault}, PublishResult(), POLICY)
    settlement = to_settlement(verdicts)
    assert settlement.dead == [("a", "invalid_option: options.x: unknown option", False)]


def test_to_settlement__retries_carry_code_and_text_and_gave_up_names_the_attempts() -> None:
    verdicts = decide([row("b"), row("c", attempts=2)], {},
                      PublishResult(failed={"b": NACKED, "c": NACKED}), POLICY)
    settlement = to_settlement(verdicts)
    assert [(i, e) for i, e, *_ in settlement.retry] == [("b", "nacked: nacked by the broker")]
    assert settlement.dead == [("c", "gave up after 3 attempts: nacked: nacked by the broker",
                                True)]
