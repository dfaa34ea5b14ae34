"""The Kubernetes API misbehaves for TESSERA_FAULT_API_S (default 60 s): pod creation answers 500,
every other write 409 Conflict, and reads hang past the client's timeout, while reservations keep
arriving. Celery workers (on the own Redis) talk to the fake API server through a kubeconfig.
When it recovers, within the stated time every reservation holding GPUs has exactly one pod, no
pod exists for any other, and nothing is over-committed, lost or duplicated."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from portal.fleet.models import Node
from portal.reservations import rules, services
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import HOLDS_GPU, State
from tests.invariants import live_shares_ok
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FAULT_S = float(os.environ.get("TESSERA_FAULT_API_S", "60"))
CONVERGE_S = 120  # retries back off up to 30 s; reconcile finds what they gave up on
NAMESPACE = "tessera"
POD_NAME = re.compile(r"^tessera-r(\d+)-\d+$")
pytestmark = [pytest.mark.timeout(int(FAULT_S) + 400)]


def _fake_module():
    spec = importlib.util.spec_from_file_location(
        "tessera_faults_fake_apiserver", ROOT / "tests" / "scheduler" / "backends" / "fake_apiserver.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def api_server(stage, settings):
    server = _fake_module().FakeApiServer(namespaces=(NAMESPACE,), validate=False).start()
    for name in Node.objects.values_list("name", flat=True):
        server.add_node(name)
    kubeconfig = stage.tmp / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "faults", "user": {"token": "faults"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "faults"}}]}))
    stage.env.update(TESSERA_BACKEND="kubernetes", KUBECONFIG=str(kubeconfig), TESSERA_NAMESPACE=NAMESPACE)
    yield server
    server.stop()


def _submit(stage, n: int) -> list[int]:
    spec = rules.ReservationSpec(team=stage.team, image="pytorch/pytorch:2.3.0", gpu_request=Decimal("0.1"),
                                 gpu_memory_mib=512)
    return [services.submit(stage.user, spec).pk for _ in range(n)]


def _pods_per_reservation(server) -> Counter:
    found = Counter()
    for pod in server.pods():
        meta = pod["metadata"]
        match = POD_NAME.match(meta["name"])
        if meta.get("namespace") == NAMESPACE and match and not meta.get("deletionTimestamp"):
            found[int(match.group(1))] += 1
    return found


def test_kubernetes_api_failing_for_a_minute(stage, api_server):
    from portal.placement.tasks import cycle, reconcile, sync

    stage.start_worker("k1")
    stage.start_worker("k2")
    submitted = _submit(stage, 20)
    wait_for(lambda: len(_pods_per_reservation(api_server)) == 20, 90, "the first pods exist before the faults")

    forever = 10**9
    api_server.inject("POST", r"/pods$", status=500, times=forever)
    api_server.inject("POST", r"/binding$", status=409, times=forever)
    api_server.inject("PATCH", r".", status=409, times=forever)
    api_server.inject("DELETE", r".", status=500, times=forever)
    api_server.inject("GET", r".", status=None, delay_s=15, times=forever)  # past the 10 s read timeout
    started = time.monotonic()
    while time.monotonic() - started < FAULT_S:
        submitted += _submit(stage, 2)
        victim = Reservation.objects.filter(pk__in=submitted, state__in=HOLDS_GPU).order_by("?").first()
        if victim is not None and time.monotonic() - started > FAULT_S / 2:
            services.cancel(victim.pk, stage.user, "faults: cancelled while the API fails")
        time.sleep(2)
    placed_meanwhile = set(Reservation.objects.filter(pk__in=submitted, state__in=HOLDS_GPU)
                           .values_list("pk", flat=True)) - set(_pods_per_reservation(api_server))
    assert placed_meanwhile, "the faults kept no pod from being made: they did not bite"
    api_server.faults.clear()
    recovered = time.monotonic()

    def converged() -> bool:
        cycle.delay(reason="faults settle")
        sync.delay()
        reconcile.delay()
        time.sleep(1.0)
        holders = set(Reservation.objects.filter(pk__in=submitted, state__in=HOLDS_GPU).values_list("pk", flat=True))
        pods = _pods_per_reservation(api_server)
        waiting = Reservation.objects.filter(pk__in=submitted, state=State.PENDING,
                                             state_reason="waiting for the next placement cycle").exists()
        return bool(holders) and set(pods) == holders and all(n == 1 for n in pods.values()) and not waiting

    wait_for(converged, CONVERGE_S, "one pod per holder and none else after the API recovered", every=0)
    took = time.monotonic() - recovered

    assert live_shares_ok() == []
    rows = list(Reservation.objects.filter(team=stage.team))
    assert sorted(r.pk for r in rows) == sorted(submitted)
    holders = {r.pk: r for r in rows if r.state in HOLDS_GPU}
    allocations = Counter(Allocation.objects.filter(released_at__isnull=True).values_list("reservation_id", flat=True))
    assert set(allocations) == set(holders) and all(allocations[pk] == r.gpu_count for pk, r in holders.items())
    assert any(r.state == State.CANCELLED for r in rows)
    print(f"{len(submitted)} submitted, {len(holders)} holding GPUs, {len(placed_meanwhile)} placed without a pod "
          f"during the faults; converged {took:.1f} s after the API recovered")
