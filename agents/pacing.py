"""Reconnect backoff and the send-rate limit."""

from __future__ import annotations

import random
import time
from collections.abc import Callable


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


class TokenBucket:
    """At most `rate` events per second on average, with bursts of up to `burst`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def wait_time(self) -> float:
        """Seconds until one event may go; 0 if it may go now."""
        self._refill()
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate

    def take(self) -> None:
        self._refill()
        self._tokens -= 1.0
