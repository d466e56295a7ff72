"""Capped exponential backoff with jitter, the one formula of every wait that repeats: a
reconnect (relay/supervise.py) and a row's retry (relay/loop/retry.py)."""

from __future__ import annotations

import random

# 2.0 ** n overflows a float past n = 1023; an attempt count can come from a producer-writable
# column (up to 2147483647), so the exponent is capped well below that.
_MAX_EXPONENT = 1024 - 64


def jittered_delay_s(base_s: float, max_s: float, attempt: int,
                     rng: random.Random | None = None) -> float:
    """The wait before attempt `attempt` (0 = the first wait): uniform between half and all
    of min(max_s, base_s * 2^attempt), so replicas that failed together do not retry together."""
    ceiling = min(max_s, base_s * 2.0 ** min(max(attempt, 0), _MAX_EXPONENT))
    return (rng or random).uniform(ceiling / 2, ceiling)
