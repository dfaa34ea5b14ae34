"""A storm on real Celery workers: 500 random submits and cancels while three worker processes race
placement cycles on the machine's Redis and PostgreSQL, with Redis losing everything and a worker
process killed half-way. Afterwards no GPU is over-committed, no reservation is lost or duplicated,
every live one has exactly its one pod, and every waiting one says why."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
import redis
from django.contrib.auth import get_user_model
from django.db import connection

from portal.celery import send_tasks_to
from portal.placement import backend as backend_module
from portal.placement.locking import forget_locks
from portal.placement.tasks import cycle, reconcile, sync
from portal.reservations import rules, services
from portal.reservations.engine_quotas import NeverFits
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import HOLDS_GPU, IllegalTransition, State
from portal.tenancy.models import Membership
from tests.invariants import live_shares_ok
from tests.teams import make_team

ROOT = Path(__file__).resolve().parents[3]
REDIS_DB = 5  # this test's own Redis database; flushed before and after
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
WORKERS = 3
OPERATIONS = 500
PLACEHOLDER = "waiting for the next placement cycle"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def _redis():
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    return client


def _database_url() -> str:
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        pytest.skip("the storm needs PostgreSQL (DATABASE_URL)")
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def workers(settings, tmp_path, fleet):
    client = _redis()
    client.flushdb()
    state = tmp_path / "cluster.sqlite3"
    env = dict(os.environ, DATABASE_URL=_database_url(), REDIS_URL=REDIS_URL, CELERY_TASK_ALWAYS_EAGER="0",
               TESSERA_BACKEND="local", TESSERA_LOCAL_STATE=str(state), TESSERA_LOCAL_START_S="0.2",
               TESSERA_LOCAL_BATCH_S="3600", DJANGO_SETTINGS_MODULE="portal.settings", LOG_LEVEL="WARNING",
               PYTHONPATH=str(ROOT))
    logs, procs = [], []
    for i in range(WORKERS):
        log = tmp_path / f"worker{i}.log"
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "-c", "1", "-n", f"storm{i}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
    previous = send_tasks_to(REDIS_URL)  # this process's tasks (cycles requested on commit) go to the workers
    settings.TESSERA_BACKEND = "local"
    settings.TESSERA_LOCAL_STATE = str(state)
    settings.TESSERA_LOCK_REDIS_URL = REDIS_URL
    try:
        deadline = time.monotonic() + 90
        while not all(" ready." in x.read_text() for x in logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail("workers did not start:\n" + "\n".join(x.read_text()[-2000:] for x in logs))
            time.sleep(0.5)
        yield logs, procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        send_tasks_to(**previous)
        backend_module.forget_backends()
        forget_locks()
        client.flushdb()


def _storm_team():
    team = make_team("storm", "Storm", quota_gpu_share=Decimal("10000"),
                               quota_memory_mib=10**9, quota_max_gpus=10000, allow_over_quota=True)
    user = get_user_model().objects.create_user("stormer", password="pw-storm")
    Membership.objects.create(user=user, team=team)
    return team, user


def _random_spec(rng: random.Random, team) -> rules.ReservationSpec:
    model, card = rng.choice([("T4", 15360), ("V100-32GB", 32768), ("A100-80GB", 81920), ("", 15360)])
    whole = rng.random() < 0.1
    request = Decimal("1") if whole else Decimal(rng.choice(["0.1", "0.2", "0.25", "0.3", "0.5", "0.7"]))
    return rules.ReservationSpec(
        team=team, image="pytorch/pytorch:2.3.0", gpu_request=request,
        gpu_limit=Decimal("1") if not whole and rng.random() < 0.3 else None,
        gpu_memory_mib=rng.randint(512, card // 2), gpu_model=model,
        gpu_count=2 if whole and rng.random() < 0.3 else 1,
        priority=rng.choice([0, 10, 50, 50, 50, 80]), requeue_on_preempt=rng.random() < 0.5,
    )


def _wait_quiet(timeout: float) -> None:
    """Until nothing is placed-but-unbound and every waiting reservation carries a real reason."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cycle.delay(reason="storm settles")
        sync.delay()
        reconcile.delay()  # as beat does: finds what lost tasks left (placed without a pod)
        time.sleep(1.0)
        placed = Reservation.objects.filter(state=State.PLACED).count()
        unexplained = Reservation.objects.filter(state=State.PENDING, state_reason=PLACEHOLDER).count()
        if placed == 0 and unexplained == 0:
            return
    pytest.fail(f"not settled: {placed} placed without a running pod, {unexplained} pending without reason")


def _faults(procs: list[subprocess.Popen]) -> None:
    """Redis restarts without persistence (queued tasks, lease, marks and counters are gone) and a
    worker process is killed in the middle of whatever it was doing."""
    _redis().flushdb()
    children = subprocess.run(["pgrep", "-P", str(procs[0].pid)], capture_output=True, text=True).stdout.split()
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)


def test_storm_of_submits_and_cancels_never_overcommits_or_loses_anything(workers, people):
    logs, procs = workers
    team, user = _storm_team()
    rng = random.Random(20261122)
    submitted: list[int] = []
    refused = cancelled = 0
    started = time.monotonic()
    for i in range(OPERATIONS):
        if submitted and rng.random() < 0.3:
            try:
                _, changed = services.cancel(rng.choice(submitted), user, "storm cancel")
                cancelled += changed
            except IllegalTransition:
                pass  # it finished first
        else:
            try:
                submitted.append(services.submit(user, _random_spec(rng, team)).pk)
            except NeverFits:
                refused += 1
        if i == OPERATIONS // 2:
            _faults(procs)
        if i % 25 == 0:
            for _ in range(WORKERS):  # one for each worker at once: cycles racing for the lock
                cycle.delay(reason="storm extra")
    stormed = time.monotonic()
    _wait_quiet(timeout=120)
    print(f"storm {stormed - started:.1f} s, settled {time.monotonic() - stormed:.1f} s later")

    # No GPU over-committed, by compute share or by memory.
    assert live_shares_ok() == []
    # Nothing lost, nothing duplicated: exactly the reservations submitted, each once.
    rows = list(Reservation.objects.filter(team=team))
    assert sorted(r.pk for r in rows) == sorted(submitted)
    assert len(submitted) > OPERATIONS // 2 and refused == 0
    # Live allocations only for reservations that hold GPUs, one per GPU of each.
    holders = {r.pk: r for r in rows if r.state in HOLDS_GPU}
    allocations = Counter(Allocation.objects.filter(released_at__isnull=True).values_list("reservation_id", flat=True))
    assert set(allocations) == set(holders)
    assert all(allocations[pk] == r.gpu_count for pk, r in holders.items())
    # Exactly one pod per live reservation, named for its current attempt; none for the others.
    sync.apply()  # this process's view of the cluster (same state file)
    cycle.apply(kwargs={"reason": "final sweep"})
    pods = backend_module.get_backend().list_pods()
    per_reservation = Counter(p.reservation_id for p in pods)
    assert all(n == 1 for n in per_reservation.values()), per_reservation.most_common(3)
    assert {int(p.reservation_id) for p in pods} == set(holders)
    assert all(p.name == holders[int(p.reservation_id)].pod_name for p in pods)
    # Every waiting reservation says why, and where it stands in the queue.
    for r in Reservation.objects.filter(team=team, state=State.PENDING):
        assert r.state_reason and r.state_reason != PLACEHOLDER, r.pk
        assert r.queue_position is not None
    # The audit log agrees with each reservation's state, and the storm did exercise everything.
    states = Counter(r.state for r in rows)
    assert states[State.RUNNING] > 20 and states[State.CANCELLED] > 20 and states[State.PENDING] > 0, states
    for r in rows:
        assert r.transitions.last().to_state == r.state
    # All three workers ran cycles, and cycles did find the lock taken by another worker.
    texts = [log.read_text() for log in logs]
    assert all(re.search(r"placement\.cycle\[.*\] succeeded", t) for t in texts), [t[-500:] for t in texts]
    assert any(re.search(r"placement\.cycle\[.*\] succeeded in [0-9.e-]+s: 0$", t, re.M) for t in texts)


def test_workers_keep_their_database_connections_and_survive_the_server_closing_them(workers, people):
    """Worker processes keep one PostgreSQL connection across tasks (portal.celery). When the
    server ends those connections (a restart, a failover), the next task notices before using
    its connection and reconnects: the next submission is still placed and bound."""
    team, user = _storm_team()
    spec = rules.ReservationSpec(team=team, image="pytorch/pytorch:2.3.0", gpu_request=Decimal("0.1"),
                                 gpu_memory_mib=512)

    def bound(rid: int, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if Reservation.objects.filter(pk=rid, state__in=HOLDS_GPU).exclude(pod_uid="").exists():
                return True
            time.sleep(0.2)
        return False

    assert bound(services.submit(user, spec).pk)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        kept = [pid for (pid,) in cursor.fetchall()]
        assert kept, "the workers closed their connections after their tasks"
        cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [kept])
        assert all(ended for (ended,) in cursor.fetchall())
    assert bound(services.submit(user, spec).pk)
    texts = "".join(log.read_text() for log in workers[0])
    assert "OperationalError" not in texts and "InterfaceError" not in texts, texts[-3000:]
