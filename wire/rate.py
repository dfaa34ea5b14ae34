"""The message-rate rule of wire/PROTOCOL.md (section 2, Limits): the agent keeps to a token bucket when it
sends, the portal runs one per connection when it receives (and one per browser connection)."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """At most `rate` events per second on average, with bursts of up to `burst`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
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

    def take(self) -> bool:
        """Spend a token for one event: False (and nothing spent) when there is none now."""
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
