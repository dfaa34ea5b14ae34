"""The wait a waiting reservation is told counts the fleet's planned drains: a node planned for
maintenance before its GPUs free up does not take the work, and takes it again after the plan."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from portal.audit import services as audit
from portal.fleet import drain_plans
from portal.fleet.models import Gpu, Node
from portal.reservations import drain_effects
from portal.reservations.models import Reservation
from tests.reservations import running, submitted

URL = "/api/v1/reservations/"


def _hold_node(people, teams, node, hours):
    """Every GPU of `node` held by nlp work that ends in `hours` (interactive: a known end)."""
    for gpu in Gpu.objects.filter(node__name=node):
        running(submitted(people["bob"], teams["nlp"], gpu_request=Decimal(1), gpu_memory_mib=1000, kind="interactive",
                          max_duration_s=int(hours * 3600), gpu_model="A100-80GB"), gpu)


def _hours_to_start(rid) -> float:
    return (Reservation.objects.get(pk=rid).estimated_start - timezone.now()).total_seconds() / 3600


def test_a_planned_drain_moves_the_start_a_waiting_user_is_told(
        client_for, reservation_body, people, teams, placement_loop):
    from tests.teams import set_any_quota

    set_any_quota(teams["nlp"], share=20, gpus=20)
    _hold_node(people, teams, "a100-node-2", 1)  # frees first: the start without a plan
    _hold_node(people, teams, "a100-node-1", 3)
    alice = client_for("alice")
    rid = alice.post(URL, reservation_body(gpu_model="A100-80GB", gpu_request=1.0, gpu_memory_mib=1000),
                     format="json").json()["id"]
    placement_loop()
    assert alice.get(f"{URL}{rid}/").json()["state"] == "pending"
    assert 0.9 < _hours_to_start(rid) <= 1.0

    # a100-node-2 goes into maintenance in 10 minutes, for two hours: its GPUs free up during the
    # drain, and take new work only when it ends (before a100-node-1's, in 3 h).
    now = timezone.now()
    drain_effects.plan_drain(Node.objects.get(name="a100-node-2"), audit.web(people["admin"]),
                             drain_plans.window_of(now + timedelta(minutes=10), now + timedelta(hours=2),
                                                   "firmware update"))
    placement_loop()
    told = alice.get(f"{URL}{rid}/").json()
    assert told["state"] == "pending" and told["estimated_start"] is not None
    assert 1.9 < _hours_to_start(rid) <= 2.0
