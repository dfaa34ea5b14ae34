"""The portal's HTTP side as deployed: Gunicorn with portal/web_server.py's settings. It serves the
API with its authentication, answers bounded request heads with a 4xx before Django sees them, and
replaces a worker that dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from portal.tenancy.models import Membership, Role, Team
from portal.tenancy.services import create_token

ROOT = Path(__file__).resolve().parents[3]


def _url() -> str:
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def _workers(master: int) -> list[int]:
    return [int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split()]


def _get(port: int, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def web(transactional_db, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": _url(), "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT),
           "REDIS_URL": "", "TESSERA_TELEMETRY_TICKER": "0", "LOG_LEVEL": "WARNING", "DEBUG": "0",
           "TESSERA_WEB_PROCESSES": "2", "TESSERA_WEB_THREADS": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:portal.web_server", "-b",
                             f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                            stdout=(tmp_path / "web.log").open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (len(_workers(proc.pid)) == 2 and _get_ok(port)):
        time.sleep(0.2)
    yield proc, port
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def _get_ok(port: int) -> bool:
    try:
        return _get(port, "/login/")[0] == 200
    except OSError:
        return False


def test_gunicorn_serves_the_api_to_a_token_and_refuses_anyone_else(web):
    _, port = web
    team = Team.objects.create(slug="vision", name="Vision")
    user = get_user_model().objects.create_user("alice")
    Membership.objects.create(user=user, team=team, role=Role.MEMBER)
    _, key = create_token(user, "cli")

    status, body = _get(port, "/api/v1/teams/", {"Authorization": f"Token {key}"})
    assert status == 200 and [t["slug"] for t in json.loads(body)["results"]] == ["vision"]
    assert _get(port, "/api/v1/teams/")[0] == 401
    assert _get(port, "/api/v1/teams/", {"Authorization": "Token " + "x" * 43})[0] == 401
    # Two processes × two threads: concurrent requests are all answered.
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: _get(port, "/api/v1/teams/", {"Authorization": f"Token {key}"})[0],
                                 range(24)))
    assert statuses == [200] * 24


def test_an_oversized_request_head_is_refused_before_django(web):
    _, port = web
    assert _get(port, "/login/", {"X-Padding": "a" * 9000})[0] in (400, 431)
    assert _get(port, "/login/?" + "a" * 9000)[0] in (400, 414)
    assert _get(port, "/login/", {f"X-Header-{i}": "x" for i in range(120)})[0] in (400, 431)
    assert _get(port, "/login/")[0] == 200  # the server is fine afterwards


def test_a_worker_that_dies_is_replaced(web):
    proc, port = web
    before = _workers(proc.pid)
    os.kill(before[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (len(_workers(proc.pid)) < 2 or before[0] in _workers(proc.pid)):
        time.sleep(0.2)
    after = _workers(proc.pid)
    assert len(after) == 2 and before[0] not in after
    assert all(_get(port, "/login/")[0] == 200 for _ in range(6))


def test_a_worker_is_ready_before_its_first_request_and_keeps_startup_objects_out_of_full_collections():
    """post_worker_init, in a fresh interpreter as in a new worker: the views are imported and what
    is loaded by then is frozen (gc.get_freeze_count counts it), so full collections skip it."""
    code = ("import gc, sys\nimport django\nfrom portal import web_server\ndjango.setup()\n"
            "assert gc.get_freeze_count() == 0\nweb_server.post_worker_init(None)\n"
            "assert 'portal.api.views' in sys.modules, 'views not imported'\n"
            "print(gc.get_freeze_count())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3],
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"})
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) > 100_000
