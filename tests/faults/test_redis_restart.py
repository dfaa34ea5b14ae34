"""Redis (Celery's broker, the channel layer, the cache, the placement lease) dies and comes back
empty while API users submit and an agent streams. Every reservation the API confirmed exists
once, none the API refused exists, nothing 500s, placements converge within the stated time
after Redis is back, and the agent's telemetry has no hole."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from portal.fleet.models import Node
from portal.fleet.services import issue_node_token
from portal.reservations.models import Reservation
from portal.telemetry.models import GpuSample
from portal.tenancy.services import create_token
from tests.waiting import wait_for

from .conftest import assert_consistent, sample_holes, settle, start_agent, start_portal

pytestmark = [pytest.mark.timeout(300)]
DOWN_S = 6
CONVERGE_S = 60


def test_redis_restart_under_load(stage):
    stage.start_worker("w1")
    _, base = start_portal(stage)
    node = Node.objects.get(name="a100-node-1")
    start_agent(stage, base, node.name, issue_node_token(node))
    wait_for(lambda: GpuSample.objects.filter(gpu__node=node).exists(), 60, "the agent's first samples")
    _, key = create_token(stage.user, "load")

    answers: list[tuple[float, int, int | None]] = []
    stop = threading.Event()

    def submitter() -> None:
        body = {"team": "faults", "image": "pytorch/pytorch:2.3.0", "gpu_request": 0.1, "gpu_memory_mib": 512}
        with httpx.Client(base_url=base, headers={"Authorization": f"Token {key}"}, timeout=30) as client:
            while not stop.is_set():
                try:
                    r = client.post("/api/v1/reservations/", json=body)
                    rid = r.json().get("id") if r.status_code == 201 else None
                    answers.append((time.monotonic(), r.status_code, rid))
                except httpx.HTTPError:
                    answers.append((time.monotonic(), 0, None))
                time.sleep(0.1)

    thread = threading.Thread(target=submitter)
    thread.start()
    try:
        time.sleep(3)
        stage.redis.kill()
        down_at = time.monotonic()
        time.sleep(DOWN_S)
        stage.redis.start()
        up_at = time.monotonic()
        time.sleep(4)
    finally:
        stop.set()
        thread.join(60)
    took = settle(CONVERGE_S)

    statuses = [s for _, s, _ in answers]
    during = [s for t, s, _ in answers if down_at <= t <= up_at]
    assert 500 not in statuses, statuses
    assert statuses.count(201) > 20 and during, statuses
    confirmed = sorted(rid for _, s, rid in answers if rid is not None)
    stored = sorted(Reservation.objects.filter(team=stage.team).values_list("pk", flat=True))
    # What was confirmed exists; a refusal (503) left nothing behind.
    assert stored == confirmed
    assert_consistent(stage.team, confirmed)
    # The agent kept its samples while the portal could not fan them out, and nothing is missing.
    last = GpuSample.objects.filter(gpu__node=node).order_by("-ts").values_list("ts", flat=True).first()
    wait_for(lambda: GpuSample.objects.filter(gpu__node=node, ts__gt=last).exists(), 30, "samples after the restart")
    assert sample_holes(node.name) == []
    print(f"answers while Redis was down: {sorted(set(during))}; converged {took:.1f} s after")
