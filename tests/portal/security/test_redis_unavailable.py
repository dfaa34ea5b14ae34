"""With the cache's Redis away, writes go on (their throttle is skipped), sign-ins answer 503
with Retry-After (their throttle cannot be checked, and hashing unthrottled is what it prevents),
and a committed change whose notifications fail is still answered as done."""

import socket

import pytest
from rest_framework.test import APIClient


@pytest.fixture
def dead_redis_cache(settings):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    # (pytest-django's settings fixture makes Django drop its cache connections on the change.)
    working = settings.CACHES
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{port}/0"}}
    yield
    settings.CACHES = working  # before the suite's own fixtures clear the cache


def test_writes_go_on_and_sign_ins_answer_503(client_for, fleet, reservation_body, dead_redis_cache):
    r = client_for("alice").post("/api/v1/reservations/", reservation_body(), format="json")
    assert r.status_code == 201
    r = APIClient().post("/api/v1/auth/token/", {"username": "alice", "password": "pw-alice", "name": "laptop"},
                     format="json")
    assert r.status_code == 503 and int(r["Retry-After"]) > 0
    r = APIClient().post("/login/", {"username": "alice", "password": "pw-alice"})
    assert r.status_code == 503
