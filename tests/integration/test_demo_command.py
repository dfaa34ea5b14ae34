"""`manage.py demo` as a person runs it: it refuses a taken port before doing anything, states the
Redis database and key prefix it uses, and SIGTERM (as Ctrl-C) stops every process it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import redis

from tests.integration.conftest import REDIS_URL
from tests.integration.test_quickstart import ROOT, free_port, wait_for


def demo_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    return env | extra


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (read from /proc: children, their children, …)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_taken_port_is_refused_before_anything_is_done(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "manage.py", "demo", "--port", str(port), "--no-redis"], cwd=ROOT,
                             env=demo_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"port {port} is already in use" in out.stderr and "Nothing was started." in out.stderr
    assert "Tessera is running" not in out.stdout + out.stderr
    assert not (tmp_path / "demo.sqlite3").exists() or (tmp_path / "demo.sqlite3").stat().st_size == 0  # not migrated


def test_sigterm_stops_every_process_it_started(tmp_path):
    port = free_port()
    env = demo_env(tmp_path, TESSERA_DEMO_REDIS_URL=REDIS_URL, TESSERA_REDIS_PREFIX="test-demo:")
    store = redis.Redis.from_url(REDIS_URL)
    store.flushdb()  # this suite's own database: only the demo writes to it from here on
    log_path = tmp_path / "demo.log"
    log = log_path.open("w")
    demo = subprocess.Popen([sys.executable, "manage.py", "demo", "--port", str(port), "--no-history"], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "Tessera is running" in log_path.read_text() or demo.poll() is not None, 180, "the demo")
        output = log_path.read_text()
        assert "Tessera is running" in output, output[-3000:]
        assert f"Redis {REDIS_URL}, keys prefixed 'test-demo:'" in output
        wait_for(lambda: len(descendants(demo.pid)) >= 4, 60, "the portal, worker, beat and fleet")
        # Celery's, the cache's and the channel layer's keys carry the prefix it stated.
        # (The queue's binding is declared as the worker starts consuming: stopping it earlier,
        # half-started, is Celery's own business and prints its traceback.)
        wait_for(lambda: store.exists("test-demo:_kombu.binding.celery"), 60, "the worker's queue, prefixed")
        assert [k for k in store.scan_iter() if not k.startswith((b"test-demo:", b"tessera:"))] == []
        started = descendants(demo.pid)
        assert not port_free(port)

        demo.send_signal(signal.SIGTERM)  # to the demo alone, as `kill` or a service manager sends it
        demo.wait(timeout=60)
        assert [p for p in started if alive(p)] == []
        assert port_free(port)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for pid in descendants(demo.pid):
            os.kill(pid, signal.SIGKILL)
        log.close()
    output = log_path.read_text()
    assert "Traceback" not in output, output[-4000:]
