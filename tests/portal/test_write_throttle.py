"""The write throttle: DRF's sliding window per user, kept and decided in Redis by one script call
(portal.api.throttling.WINDOW) where the cache is Redis, by DRF itself elsewhere. Both answer the
same, request for request; in Redis the last free slot goes to one request only."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest
import redis
from django.core.cache import caches

from portal.api.throttling import WriteRateThrottle

REDIS_URL = f"redis://127.0.0.1:6379/{int(os.environ.get('TESSERA_TEST_REDIS_DB', '7'))}"


@pytest.fixture
def redis_cache(settings):
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        pytest.fail(f"this test needs Redis at {REDIS_URL}: {exc}")
    working = settings.CACHES
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
    yield client
    settings.CACHES = working
    client.flushdb()


@pytest.fixture
def three_a_minute(monkeypatch):
    monkeypatch.setattr(WriteRateThrottle, "THROTTLE_RATES", {"writes": "3/min"})


def _decisions(user) -> list:
    """(allowed, wait) for writes at these seconds, as the throttle answers them."""
    out = []
    for now in (0.0, 1.5, 2.0, 3.0, 30.0, 59.99, 60.0, 60.5, 61.5, 62.0, 125.0):
        throttle = WriteRateThrottle()
        throttle.timer = lambda now=now: 1_700_000_000.0 + now
        allowed = throttle.allow_request(SimpleNamespace(method="POST", user=user), None)
        out.append((allowed, None if allowed else round(throttle.wait(), 6)))
    return out


def test_redis_window_answers_as_drfs_own(people, three_a_minute, redis_cache):
    from django.test import override_settings

    user = people["alice"]
    with override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}):
        by_drf = _decisions(user)
        assert not redis_cache.keys()
    in_redis = _decisions(user)
    assert in_redis == by_drf
    assert [allowed for allowed, _ in in_redis].count(False) == 4 and in_redis[3] == (False, 57.0)
    key = caches["default"].make_and_validate_key(f"throttle-window_writes_{user.pk}")
    assert redis_cache.type(key) == b"list" and 0 < redis_cache.ttl(key) <= 60
    assert WriteRateThrottle().allow_request(SimpleNamespace(method="GET", user=user), None)


def test_the_last_free_slot_goes_to_one_request_only(people, three_a_minute, redis_cache):
    user, barrier, allowed = people["bob"], threading.Barrier(12), []

    def write() -> None:
        throttle = WriteRateThrottle()
        barrier.wait()
        allowed.append(throttle.allow_request(SimpleNamespace(method="POST", user=user), None))

    threads = [threading.Thread(target=write) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(allowed) == [False] * 9 + [True] * 3


def test_throttled_write_answers_429_with_retry_after(client_for, fleet, reservation_body, three_a_minute,
                                                      redis_cache):
    alice = client_for("alice")
    answers = [alice.post("/api/v1/reservations/", reservation_body(gpu_request=0.1), format="json")
               for _ in range(4)]
    assert [r.status_code for r in answers] == [201, 201, 201, 429]
    assert 55 <= int(answers[3]["Retry-After"]) <= 60
    assert answers[3].json()["detail"].startswith("Request was throttled. Expected available in ")
    assert alice.get("/api/v1/reservations/").status_code == 200  # reads are not throttled
