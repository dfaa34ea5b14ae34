"""A hung Kubernetes API server delays binds and housekeeping, never the decisions: the placement
cycle reads only the database and runs only the engine, so a portal reservation is placed as
quickly against an API server that answers after 30 s as against a prompt one, and the cycle sends
the API server nothing at all. The measured times are printed (run with -s); no clock is judged."""

from __future__ import annotations

import importlib.util
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from portal.celery import app as celery_app
from portal.fleet import inventory
from portal.placement import backend as backend_module
from portal.placement import tasks
from portal.reservations import rules, services
from portal.reservations.models import Reservation
from portal.reservations.states import State
from tests.scheduler.backends.portal_on_fake_cluster import point_portal_at

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = ROOT / "deploy" / "inventory" / "demo.yaml"
SLOW_S = 30.0


def _fake_apiserver_module():
    name = "tessera_tests_fake_apiserver"  # the name tests/scheduler/backends/conftest.py loads it by
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "scheduler" / "backends" /
                                                      "fake_apiserver.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def apiserver():
    server = _fake_apiserver_module().FakeApiServer(namespaces=("default", "tessera")).start()
    yield server
    server.answer_delay_s = 0.0
    server.stop()


@pytest.fixture
def portal_on_kubernetes(settings, apiserver, tmp_path, monkeypatch, people, teams):
    """The portal with TESSERA_BACKEND=kubernetes, its kubeconfig pointing at the fake API server;
    Celery tasks in-process; the demo fleet's nodes on both sides."""
    point_portal_at(apiserver, settings, tmp_path, monkeypatch)
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    inventory.load(INVENTORY)
    for name in inventory_names():
        apiserver.add_node(name)
    backend_module.forget_backends()
    yield apiserver
    backend_module.forget_backends()
    celery_app.conf.task_always_eager = eager


def inventory_names() -> list[str]:
    from portal.fleet.models import Node

    return list(Node.objects.values_list("name", flat=True))


def _decide_one(people, teams, django_capture_on_commit_callbacks) -> tuple[float, int]:
    """Submit a portal reservation and run the cycle, leaving its bind unsent (captured, not
    run): seconds from submission to the committed decision, and the reservation id."""
    started = time.perf_counter()
    with django_capture_on_commit_callbacks(execute=False):
        r = services.submit(people["alice"], rules.ReservationSpec(
            team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.25"), gpu_memory_mib=1024))
    with django_capture_on_commit_callbacks(execute=False) as binds:
        tasks.run_cycles("measured")
    took = time.perf_counter() - started
    assert binds, "the cycle hands its placements to a bind task after commit"
    return took, r.pk


def test_a_hung_api_server_does_not_delay_decisions(portal_on_kubernetes, people, teams,
                                                      django_capture_on_commit_callbacks):
    apiserver = portal_on_kubernetes
    prompt_s, first = _decide_one(people, teams, django_capture_on_commit_callbacks)
    apiserver.answer_delay_s = SLOW_S  # every answer from now on comes after 30 s, like a stalled etcd
    before = len(apiserver.requests)
    hung_s, second = _decide_one(people, teams, django_capture_on_commit_callbacks)
    assert len(apiserver.requests) == before, [r.path for r in apiserver.requests[before:]]
    for rid in (first, second):
        r = Reservation.objects.get(pk=rid)
        assert r.state == State.PLACED and r.pod_name == f"tessera-r{rid}-1", r.state_reason
    print(f"\nsubmission → committed decision: {prompt_s:.3f} s with a prompt API server, "
          f"{hung_s:.3f} s with one answering after {SLOW_S:.0f} s (no request sent by the cycle)")


def test_housekeeping_is_single_flight(portal_on_kubernetes):
    """While one housekeeping task talks to the cluster, another one skips instead of queueing
    behind it: a hung API server ties up one worker, not all of them."""
    from portal.placement.locking import single_flight

    with single_flight("housekeeping", 60) as held:
        assert held
        assert tasks.housekeeping() == {"skipped": True}
    with single_flight("housekeeping", 60) as held:
        assert held  # released when the holder finished
