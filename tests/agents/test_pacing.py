"""Reconnect backoff and the protocol's rate limit (wire.rate), on their own (timing-free, seeded)."""

from __future__ import annotations

import random

from agents.pacing import Backoff
from wire.rate import TokenBucket


def test_backoff_grows_exponentially_then_stays_at_the_cap():
    backoff = Backoff(base_s=0.5, cap_s=30.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(12)]
    ceilings = [min(30.0, 0.5 * 2**n) for n in range(12)]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 30.0
    assert all(d >= 15.0 for d in delays[6:])  # at the cap: between half the cap and the cap


def test_backoff_is_jittered_so_a_fleet_does_not_reconnect_in_step():
    firsts = set()
    for seed in range(20):
        backoff = Backoff(base_s=1.0, cap_s=60.0, rng=random.Random(seed))
        for _ in range(5):
            delay = backoff.next_delay()
        firsts.add(round(delay, 3))
    assert len(firsts) > 15


def test_backoff_reset_starts_short_again():
    backoff = Backoff(base_s=0.5, cap_s=8.0, rng=random.Random(2))
    for _ in range(10):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_token_bucket_allows_a_burst_then_the_rate():
    now = [0.0]
    bucket = TokenBucket(rate=5.0, burst=10, clock=lambda: now[0])
    sent = 0
    while bucket.wait_time() == 0.0:
        bucket.take()
        sent += 1
    assert sent == 10
    assert bucket.take() is False  # refused, and nothing spent: the wait stays one token's
    assert abs(bucket.wait_time() - 0.2) < 1e-9
    now[0] += 1.0
    sent = 0
    while bucket.wait_time() == 0.0:
        bucket.take()
        sent += 1
    assert sent == 5
