"""The fault-injection suite's stage: a Redis server of its own (so restarting it disturbs no one
else on the machine), real Celery workers and a real portal on the test database, and the checks
every fault ends with: no GPU over-committed, no reservation lost or duplicated, one pod each.

Each test states the time it allows for convergence; the suite as a whole is bounded by the
timeouts on its tests.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest
import redis
from django.contrib.auth import get_user_model
from django.db import connection

from tests.teams import make_team
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "deploy" / "inventory" / "demo.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def database_url() -> str:
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        pytest.skip("the fault suite needs PostgreSQL (DATABASE_URL)")
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class OwnRedis:
    """A redis-server process on a free port, no persistence: a restart loses everything, as a
    crashed Redis without a volume would."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.tmp)], stdout=(self.tmp / "redis.log").open("ab"), stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        wait_for(lambda: self._pings(client), 15, "own redis-server answers")

    @staticmethod
    def _pings(client) -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=1)


@pytest.fixture
def own_redis(tmp_path):
    if not any(Path(d, "redis-server").exists() for d in os.environ.get("PATH", "").split(":")):
        pytest.fail("the fault suite needs the redis-server binary (Debian package redis-server)")
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.kill()


@dataclass
class Stage:
    tmp: Path
    redis: OwnRedis
    env: dict
    team: object
    user: object
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start_worker(self, name: str) -> subprocess.Popen:
        log = self.tmp / f"worker-{name}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "-c", "1", "-n", f"{name}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
            cwd=ROOT, env=self.env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        wait_for(lambda: " ready." in log.read_text() or proc.poll() is not None, 90, f"worker {name} starts")
        assert proc.poll() is None, log.read_text()[-3000:]
        return proc

    @staticmethod
    def kill9(proc: subprocess.Popen) -> None:
        """The whole worker (main process and its pool child) dies at once, as on a lost node."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def stage(transactional_db, own_redis, settings, tmp_path):
    """Fleet (the demo inventory), a team with room, its member; Celery of this process and of
    the workers on the own Redis; the simulated cluster's state in tmp."""
    from portal.celery import send_tasks_to
    from portal.fleet import inventory
    from portal.placement import backend as backend_module
    from portal.placement.locking import forget_locks
    from portal.tenancy.models import Membership

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(INVENTORY)
    team = make_team("faults", "Faults", quota_gpu_share=Decimal("10000"),
                               quota_memory_mib=10**9, quota_max_gpus=10_000, allow_over_quota=True)
    user = get_user_model().objects.create_user("faulty", password="pw-faulty")
    Membership.objects.create(user=user, team=team)
    state = tmp_path / "cluster.sqlite3"
    env = dict(os.environ, DATABASE_URL=database_url(), REDIS_URL=own_redis.url, CELERY_TASK_ALWAYS_EAGER="0",
               TESSERA_BACKEND="local", TESSERA_LOCAL_STATE=str(state), TESSERA_LOCAL_START_S="0.2",
               TESSERA_LOCAL_BATCH_S="3600", DJANGO_SETTINGS_MODULE="portal.settings", LOG_LEVEL="WARNING",
               TESSERA_TELEMETRY_TICKER="0", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    previous = send_tasks_to(own_redis.url)
    settings.TESSERA_BACKEND = "local"
    settings.TESSERA_LOCAL_STATE = str(state)
    settings.TESSERA_LOCK_REDIS_URL = own_redis.url
    forget_locks()
    staged = Stage(tmp=tmp_path, redis=own_redis, env=env, team=team, user=user)
    try:
        yield staged
    finally:
        staged.stop_all()
        send_tasks_to(**previous)
        backend_module.forget_backends()
        forget_locks()


def settle(timeout: float) -> float:
    """Nudge as beat would (cycle, sync, reconcile) until nothing is placed without a pod and every
    waiting reservation says why. Returns the seconds it took; fails past `timeout`."""
    from portal.placement.tasks import cycle, reconcile, sync
    from portal.reservations.models import Reservation
    from portal.reservations.states import State

    started = time.monotonic()

    def quiet() -> bool:
        cycle.delay(reason="faults settle")
        sync.delay()
        reconcile.delay()
        time.sleep(1.0)
        placed = Reservation.objects.filter(state=State.PLACED).count()
        unexplained = Reservation.objects.filter(state=State.PENDING,
                                                 state_reason="waiting for the next placement cycle").count()
        return placed == 0 and unexplained == 0

    wait_for(quiet, timeout, "placements converge (nothing placed without a running pod)", every=0)
    return time.monotonic() - started


def assert_consistent(team, submitted: list[int]) -> None:
    """No GPU over-committed; exactly the reservations submitted, each once; one live allocation
    per GPU of each holder; exactly one pod per holder, none for the others."""
    from portal.placement import backend as backend_module
    from portal.placement.tasks import sync
    from portal.reservations.models import Allocation, Reservation
    from portal.reservations.states import HOLDS_GPU
    from tests.invariants import live_shares_ok

    assert live_shares_ok() == []
    rows = list(Reservation.objects.filter(team=team))
    assert sorted(r.pk for r in rows) == sorted(submitted)
    holders = {r.pk: r for r in rows if r.state in HOLDS_GPU}
    allocations = Counter(Allocation.objects.filter(released_at__isnull=True).values_list("reservation_id", flat=True))
    assert set(allocations) == set(holders)
    assert all(allocations[pk] == r.gpu_count for pk, r in holders.items())
    sync.apply()
    pods = backend_module.get_backend().list_pods()
    per_reservation = Counter(int(p.reservation_id) for p in pods)
    assert all(n == 1 for n in per_reservation.values()), per_reservation.most_common(3)
    assert set(per_reservation) == set(holders)


def start_portal(stage: Stage, host: str = "127.0.0.1", port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Daphne serving the portal on the stage's database and Redis; returns (process, base URL)."""
    port = port or free_port()
    log = stage.tmp / "daphne.log"
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", host, "-p", str(port), "portal.asgi:application"],
                            cwd=ROOT, env=stage.env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    stage.procs.append(proc)

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex((host if host != "0.0.0.0" else "127.0.0.1", port)) == 0

    wait_for(listening, 60, "the portal listens")
    return proc, f"http://{host if host != '0.0.0.0' else '127.0.0.1'}:{port}"


def start_agent(stage: Stage, portal_url: str, node: str, token: str, *, interval: float = 0.5,
                prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """A real simulated agent process (optionally run through `prefix`, e.g. `ip netns exec NS`)."""
    log = stage.tmp / f"agent-{node}.log"
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "agents", "--portal", portal_url, "--simulate", str(INVENTORY),
         "--node", node, "--interval", str(interval), "--backoff-max", "2", "--seed", "1", "--log-level", "INFO"],
        cwd=ROOT, env={**os.environ, "TESSERA_AGENT_TOKEN": token, "PYTHONPATH": str(ROOT)},
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    stage.procs.append(proc)
    return proc


def sample_holes(node_name: str) -> list[tuple[int, int]]:
    """Gaps in the stored sequence numbers of the node's streams: (after seq, before seq)."""
    from portal.telemetry.models import GpuSample

    holes = []
    by_stream: dict[int, list[int]] = {}
    for stream, seq in GpuSample.objects.filter(stream__node__name=node_name).values_list("stream_id", "seq") \
            .distinct().order_by("stream_id", "seq"):
        by_stream.setdefault(stream, []).append(seq)
    for seqs in by_stream.values():
        holes += [(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1]
    return holes
