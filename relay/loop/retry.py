"""Pure settlement logic: capped exponential backoff with jitter, and a batch's fate per row."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from relay.interfaces import OutboxRow, PublishResult, Settlement


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed publishes are retried before a row is dead-lettered."""

    max_attempts: int
    base_s: float
    max_s: float

    def delay_s(self, attempts: int, rng: random.Random | None = None) -> float:
        """Delay before retry number `attempts` (1 = first retry): half fixed, half jitter."""
        ceiling = min(self.max_s, self.base_s * 2.0 ** max(attempts - 1, 0))
        jitter: float = (rng or random).uniform(0, ceiling / 2)
        return ceiling / 2 + jitter


def plan_settlement(
    rows: Sequence[OutboxRow],
    result: PublishResult,
    invalid: Mapping[str, str],
    policy: RetryPolicy,
) -> Settlement:
    """Decide each row's fate: published, retried later, dead-lettered, or left untouched.

    Rows in `result.unsent` are left as they were (no attempt counted): their publish never
    reached a verdict because the broker connection was lost, which is not the row's fault.
    """
    settlement = Settlement(published=list(result.confirmed))
    for row in rows:
        reason = invalid.get(row.id) or result.invalid.get(row.id)
        if reason is not None:
            settlement.dead.append((row.id, reason, False))
            continue
        error = result.failed.get(row.id)
        if error is None:
            continue
        attempts = row.attempts + 1
        if attempts >= policy.max_attempts:
            settlement.dead.append((row.id, f"gave up after {attempts} attempts: {error}", True))
        else:
            settlement.retry.append((row.id, error, policy.delay_s(attempts)))
    return settlement
