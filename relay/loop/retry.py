"""Retry timing: capped exponential backoff with jitter (relay/loop/verdicts.py applies it)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from relay.backoff import jittered_delay_s


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed publishes are retried before a row is dead-lettered."""

    max_attempts: int
    base_s: float
    max_s: float

    def delay_s(self, attempts: int, rng: random.Random | None = None) -> float:
        """Delay before retry number `attempts` (1 = first retry): half fixed, half jitter."""
        return jittered_delay_s(self.base_s, self.max_s, attempts - 1, rng)
