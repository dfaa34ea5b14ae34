"""The README's `make demo` path: `manage.py demo` on embedded defaults (SQLite, in-process tasks,
simulated nodes) takes a reservation from submission to running, and Ctrl-C stops everything."""

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests import waiting

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None, token=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Token {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)



def wait_for(predicate, seconds, what):
    """The quickstart's servers refuse connections while they start: that is "not yet"."""
    return waiting.wait_for(predicate, seconds, what, every=1.0, ignore=(OSError,))

def test_demo_runs_a_reservation_and_stops_cleanly(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    log = open(tmp_path / "demo.log", "w")  # noqa: SIM115 - closed below, after the process
    demo = subprocess.Popen([sys.executable, "manage.py", "demo", "--port", str(port), "--no-redis"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: urllib.request.urlopen(f"{base}/login/", timeout=5).status == 200, 120, "the portal")
        key = call(f"{base}/api/v1/auth/token/", {"username": "alice", "password": "tessera-demo",
                                                   "name": "quickstart"})["key"]
        made = call(f"{base}/api/v1/reservations/", {"team": "vision", "image": "jupyter/base-notebook:1",
                                                     "kind": "interactive", "gpu_request": 0.3,
                                                     "gpu_memory_mib": 4096}, token=key)
        assert made["state"] == "pending"

        def running():
            r = call(f"{base}/api/v1/reservations/{made['id']}/", token=key)
            return r if r["state"] == "running" else None

        r = wait_for(running, 90, "the reservation to run")
        assert r["node"] and r["allocations"][0]["gpu_request"] == 0.3
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(timeout=30)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
            log.close()
    output = (tmp_path / "demo.log").read_text()
    assert "Tessera is running: open" in output
    assert "Traceback" not in output, output[-3000:]
