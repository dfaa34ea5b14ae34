"""Suite-wide settings: tests run against the real PostgreSQL on this machine unless DATABASE_URL
says otherwise (the README's test command sets it)."""

import contextlib
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """One test database per pytest run (test_<name>_<pid>), so runs on one machine never drop each
    other's database. Server processes started by tests read the name from the connection settings."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        yield
        return
    test = db.setdefault("TEST", {})
    test["NAME"] = name = f"{test.get('NAME') or 'test_' + db['NAME']}_{os.getpid()}"
    yield
    # Torn down after pytest-django's own drop, which gives up with a warning while a session is
    # still on the database (a server process a test started, not yet gone): each run would leave one.
    import psycopg

    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                         password=db["PASSWORD"] or None, dbname="postgres", autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))


@pytest.fixture
def redis_channel_layer(settings):
    """`use(url)`: Channels goes through a real channels-redis layer on that Redis database,
    flushed now and after the test; returns a client for it."""
    import redis
    from channels.layers import channel_layers

    clients = []

    def use(url: str):
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        try:
            client.flushdb()
        except redis.RedisError as exc:
            pytest.fail(f"this test needs Redis at {url}: {exc}")
        clients.append(client)
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                               "CONFIG": {"hosts": [url]}}}
        channel_layers.backends.clear()
        return client

    yield use
    channel_layers.backends.clear()
    for client in clients:
        client.flushdb()


def pytest_configure(config):
    _own_session()
    # pytest-xdist registers this marker only when it is loaded: `-p no:xdist` (a run against a real
    # cluster, one test at a time) would stop at collection under --strict-markers.
    config.addinivalue_line("markers", "xdist_group(name): the lane a test runs in under `--dist loadgroup`")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(config, items):
    """`make test` runs the suite in two lanes (`-n 2 --dist loadgroup`): the fault-injection suite
    in one, everything else in the other, each lane one test after another as written. The faults
    bring their own Redis server, portal and workers, and they mostly wait out real minutes (an
    agent cut off for five, the Kubernetes API failing for one), so they run beside the rest. The
    rest stays serial: its modules share Redis databases and measure timings on two cores."""
    faults = Path(__file__).parent / "faults"
    for item in items:
        lane = "faults" if faults in Path(item.path).parents else "suite"
        item.add_marker(pytest.mark.xdist_group(lane))


def _own_session() -> None:
    """Local pods are tied to their shares by session (agents/broker/identity.py), and the broker tests
    name this process's session as the share's. Where the session's leader is outside this PID
    namespace (a sandboxed CI), getsid answers 0, which the broker rightly takes as no session: the run
    starts its own. A process group leader (pytest typed at a shell) cannot, and has a session anyway."""
    if os.getsid(0) == 0:
        with contextlib.suppress(PermissionError):
            os.setsid()

