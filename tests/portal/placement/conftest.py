"""A simulated cluster (local backend in a temporary state file) and an in-process placement loop
for the placement tests. The personas and the demo fleet come from tests/portal/conftest.py."""

from __future__ import annotations

import pytest
import redis

from portal.celery import app as celery_app
from portal.placement import backend as backend_module
from portal.placement import tasks
from portal.placement.locking import forget_locks


@pytest.fixture
def cluster(settings, tmp_path, fleet):
    """The local backend the portal acts through; pods start at once, batch pods run 1 hour."""
    settings.TESSERA_BACKEND = "local"
    settings.TESSERA_LOCAL_STATE = str(tmp_path / "cluster.sqlite3")
    settings.TESSERA_LOCAL_START_S = 0.0
    settings.TESSERA_LOCAL_BATCH_S = 3600
    settings.TESSERA_LOCK_REDIS_URL = ""
    settings.REDIS_URL = ""
    forget_locks()
    eager = celery_app.conf.task_always_eager
    # Binds run in-process, whatever REDIS_URL says (the app reads CELERY_* from the settings).
    celery_app.conf.update(CELERY_TASK_ALWAYS_EAGER=True)
    yield backend_module.get_backend()
    celery_app.conf.update(CELERY_TASK_ALWAYS_EAGER=eager)
    backend_module.forget_backends()
    forget_locks()


@pytest.fixture
def placement_loop(cluster, django_capture_on_commit_callbacks):
    """Run what the workers would: housekeeping (ended pods, kubectl pods), a cycle (with its
    binds), then the cluster's events."""

    def run(sync: bool = True) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            tasks.housekeeping()
        with django_capture_on_commit_callbacks(execute=True):
            tasks.run_cycles("test")
        if sync:
            with django_capture_on_commit_callbacks(execute=True):
                tasks.sync()

    return run


LOCK_REDIS_URL = "redis://127.0.0.1:6379/6"  # the lock and memo tests' own Redis database


@pytest.fixture
def lock_redis():
    """A flushed Redis database for the placement lock and memo tests, flushed again after; its
    URL. Skips without a Redis on the machine."""
    client = redis.Redis.from_url(LOCK_REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    client.flushdb()
    yield LOCK_REDIS_URL
    client.flushdb()
    client.close()
