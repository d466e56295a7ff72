"""Retry timing: capped exponential backoff with jitter (relay/loop/verdicts.py applies it)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed publishes are retried before a row is dead-lettered."""

    max_attempts: int
    base_s: float
    max_s: float

    def delay_s(self, attempts: int, rng: random.Random | None = None) -> float:
        """Delay before retry number `attempts` (1 = first retry): half fixed, half jitter."""
        # The exponent is capped: attempts comes from a producer-writable column, and
        # 2.0 ** 2147483646 overflows.
        ceiling = min(self.max_s, self.base_s * 2.0 ** min(max(attempts - 1, 0), 1024 - 64))
        jitter: float = (rng or random).uniform(0, ceiling / 2)
        return ceiling / 2 + jitter
