"""Reconnect backoff. (The send-rate limit is the protocol's, `wire.rate.TokenBucket`.)"""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter: attempt n waits a random time in [d/2, d], d = min(cap, base*2^n).

    The random half keeps a fleet of agents from reconnecting in lock-step after a portal restart;
    the fixed half keeps the wait growing, so a portal that is down is not hammered.
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def ceiling(self, attempt: int) -> float:
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 64))

    def next_delay(self) -> float:
        high = self.ceiling(self.attempt)
        self.attempt += 1
        return self._rng.uniform(high / 2, high)

    def reset(self) -> None:
        self.attempt = 0
