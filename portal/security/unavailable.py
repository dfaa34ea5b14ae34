"""A database or Redis that cannot take the request now (pool exhausted, server full, restarting)
answers 503 with Retry-After, never 500: the client did nothing wrong and should come back.

Django raises its OperationalError for the database: psycopg_pool's PoolTimeout and
TooManyRequests (a full pool, a full queue of waiters), PostgreSQL's "too many clients", a lost
connection. Redis (cache: throttles; Celery's broker) raises redis' ConnectionError/TimeoutError
or kombu's OperationalError.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import OperationalError
from django.http import HttpResponse, JsonResponse
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)
RedisUnavailable = (RedisConnectionError, RedisTimeoutError)  # a tuple: `except` takes no X | Y


def is_database_unavailable(exc: BaseException | None) -> bool:
    return isinstance(exc, (OperationalError, *RedisUnavailable, KombuOperationalError))


def retry_after_s() -> int:
    return int(getattr(settings, "TESSERA_RETRY_AFTER_S", 5))


def response(request, exc: BaseException) -> HttpResponse:
    log.warning("database or Redis unavailable for %s %s: %s", request.method, request.path,
                f"{type(exc.__cause__ or exc).__name__}: {exc}")
    if request.path.startswith("/api/"):
        answer = JsonResponse({"detail": "The service is busy; try again shortly.", "code": "unavailable"},
                              status=503)
    else:
        answer = HttpResponse("The service is busy; try again in a few seconds.\n", status=503,
                              content_type="text/plain; charset=utf-8")
    answer["Retry-After"] = str(retry_after_s())
    return answer
