"""The wait a waiting reservation is told: its place in the cycle's order and a start from the
queue run forward over the ends of what runs on the GPUs that could take it, or no estimate and
why (the cases the old k-th-end rule got wrong)."""

from __future__ import annotations

from decimal import Decimal

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node
from portal.reservations.models import Reservation
from tests.reservations import running, submitted

URL = "/api/v1/reservations/"


def _hold(people, teams, model, hours, **kw):
    """Every GPU of `model` held by nlp work that ends in `hours` (interactive: a known end)."""
    for gpu in Gpu.objects.filter(model=model):
        running(submitted(people["bob"], teams["nlp"], gpu_request=Decimal(1), gpu_memory_mib=1000, kind="interactive",
                          max_duration_s=int(hours * 3600), **kw), gpu)


def test_a_request_for_a_drained_model_has_no_estimate_and_says_why(
        client_for, reservation_body, people, teams, placement_loop):
    from tests.teams import set_any_quota

    set_any_quota(teams["nlp"], share=20, gpus=20)
    _hold(people, teams, "A100-80GB", 1)  # A100 ends soon: not a V100's start
    fleet_services.drain(Node.objects.get(name="v100-node-1").pk, audit.cli("test"), "maintenance")
    alice = client_for("alice")
    rid = alice.post(URL, reservation_body(gpu_model="V100-32GB", gpu_memory_mib=1000), format="json").json()["id"]
    placement_loop()
    r = alice.get(f"{URL}{rid}/").json()
    assert r["state"] == "pending" and r["queue_position"] == 1
    assert r["estimated_start"] is None
    assert "no estimate: " in r["state_reason"]
    assert "V100-32GB" in r["state_reason"].split("no estimate: ")[1]


def test_a_t4_request_is_given_the_t4_end_not_an_earlier_a100_one(
        client_for, reservation_body, people, teams, placement_loop):
    from django.utils import timezone

    from tests.teams import set_any_quota

    set_any_quota(teams["nlp"], share=20, gpus=20)
    _hold(people, teams, "T4", 3)
    _hold(people, teams, "A100-80GB", 1)
    alice = client_for("alice")
    rid = alice.post(URL, reservation_body(gpu_model="T4", gpu_request=1.0, gpu_memory_mib=1000),
                     format="json").json()["id"]
    placement_loop()
    row = Reservation.objects.get(pk=rid)
    assert row.state == "pending" and row.estimated_start is not None
    hours = (row.estimated_start - timezone.now()).total_seconds() / 3600
    assert 2.9 < hours <= 3.0
    assert "no estimate" not in row.state_reason
