"""Connections come from a bounded pool; when it is exhausted the API and the pages answer 503
with Retry-After (never 500), and serve again once connections are back."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from portal.tenancy.services import create_token

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def tiny_pool(transactional_db):
    """This process's default connection on a pool of two that gives up after 0.3 s."""
    assert connection.vendor == "postgresql", "the pool is PostgreSQL's"
    connection.close()
    options = connection.settings_dict["OPTIONS"]
    options["pool"] = {"min_size": 0, "max_size": 2, "timeout": 0.3}
    try:
        yield connection.pool
    finally:
        connection.close()
        connection.close_pool()
        options.pop("pool", None)


def test_exhausted_pool_answers_503_with_retry_after(people, tiny_pool):
    _, key = create_token(people["alice"], "laptop")
    web = Client()
    web.force_login(people["alice"])
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/teams/").status_code == 200

    connection.close()  # the test client keeps it between requests; a server returns it to the pool
    held = [tiny_pool.getconn() for _ in range(2)]  # someone else has every connection
    try:
        r = api.get("/api/v1/teams/")  # the token lookup needs a connection
        assert r.status_code == 503 and r.json()["code"] == "unavailable"
        assert int(r["Retry-After"]) > 0
        r = api.post("/api/v1/auth/token/", {"username": "alice", "password": "pw-alice", "name": "laptop"},
                     format="json")
        assert r.status_code == 503
        r = web.get("/")  # the session's user is loaded by a middleware, before any view
        assert r.status_code == 503 and int(r["Retry-After"]) > 0
    finally:
        for conn in held:
            tiny_pool.putconn(conn)
    assert api.get("/api/v1/teams/").status_code == 200


def test_production_settings_pool_connections_and_workers_do_not(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "portal.settings",
           "TESSERA_PROFILE": "production", "SECRET_KEY": "k" * 50, "DEBUG": "0",
           "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres", "DB_POOL_MAX_SIZE": "7"}
    env.pop("DB_CONN_MAX_AGE", None)
    probe = ("import django; django.setup(); from django.conf import settings; from django.db import connections; "
             "print(settings.DATABASES['default']['OPTIONS']['pool']['max_size'], "
             "settings.DATABASES['default']['CONN_MAX_AGE']); "
             "from portal.celery import _prepare_worker_process; _prepare_worker_process(); "
             "d = connections['default'].settings_dict; print('pool' in d['OPTIONS'], d['CONN_MAX_AGE'])")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["7", "0", "False", "600"]


def test_database_failure_outside_a_view_is_503_too(rf):
    from django.db import OperationalError

    from portal.api.errors import server_error

    for path in ("/api/v1/teams/", "/"):
        try:
            raise OperationalError("couldn't get a connection after 5.00 sec")
        except OperationalError:
            r = server_error(rf.get(path))
        assert r.status_code == 503 and int(r["Retry-After"]) > 0
    try:
        raise ValueError("a bug")
    except ValueError:
        assert server_error(rf.get("/api/v1/teams/")).status_code == 500


def test_telemetry_threads_keep_their_own_connection_outside_the_pool(people, tiny_pool):
    from concurrent.futures import ThreadPoolExecutor

    from django.contrib.auth import get_user_model
    from django.db import connection as thread_connection

    from portal.telemetry.dbthread import own_connection

    assert get_user_model().objects.count() == len(people)  # opens the pool
    connection.close()
    held = [tiny_pool.getconn() for _ in range(2)]  # the web requests hold every pooled one
    try:
        with ThreadPoolExecutor(max_workers=1, initializer=own_connection) as telemetry:
            def count() -> int:
                try:
                    return get_user_model().objects.count()
                finally:
                    thread_connection.close()

            assert telemetry.submit(count).result(timeout=10) == len(people)
    finally:
        for conn in held:
            tiny_pool.putconn(conn)


def _server_ends(conn) -> None:
    """The server ends `conn` (as on a restart or an idle timeout) while it waits in the pool."""
    import select

    import psycopg

    d = connection.settings_dict
    url = f"postgresql://{d['USER']}:{d['PASSWORD']}@{d['HOST'] or '127.0.0.1'}:{d['PORT'] or 5432}/{d['NAME']}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    assert poller.poll(5000), "the server did not end the connection"


@pytest.mark.parametrize("checked", [True, False])
def test_a_pooled_connection_the_server_ended_is_never_a_500(people, tiny_pool, checked):
    """Django's pool check (CONN_HEALTH_CHECKS, kept: 0.1 ms of CPU a request) replaces such a
    connection before the request sees it; without it the request answers 503, never 500."""
    connection.close()
    connection.close_pool()
    connection.settings_dict["CONN_HEALTH_CHECKS"] = checked
    connection.settings_dict["OPTIONS"]["pool"] = {"min_size": 0, "max_size": 1, "timeout": 5}
    try:
        _, key = create_token(people["alice"], "laptop")
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        assert api.get("/api/v1/teams/").status_code == 200
        pooled = connection.connection
        connection.close()  # back to the pool, as after every request
        _server_ends(pooled)
        r = api.get("/api/v1/teams/")
        if checked:
            assert r.status_code == 200
        else:
            assert r.status_code == 503 and int(r["Retry-After"]) > 0
            connection.close()
        assert api.get("/api/v1/teams/").status_code == 200  # the pool has a new connection by now
    finally:
        connection.settings_dict["CONN_HEALTH_CHECKS"] = True
