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


def test_what_a_person_used_of_their_past_reservations_moves_the_start_others_are_told(
        client_for, reservation_body, people, teams, placement_loop):
    """bob books 4 h of T4 and has always stopped after one: alice is told about an hour, not four."""
    from datetime import timedelta

    from django.utils import timezone

    from portal.placement import queue
    from portal.reservations.models import Reservation
    from tests.teams import set_any_quota

    set_any_quota(teams["nlp"], share=20, gpus=20)
    _hold(people, teams, "T4", 4)
    alice = client_for("alice")
    rid = alice.post(URL, reservation_body(gpu_model="T4", gpu_request=1.0, gpu_memory_mib=1000),
                     format="json").json()["id"]
    placement_loop()
    told = alice.get(f"{URL}{rid}/").json()
    assert told["state"] == "pending"
    hours = (Reservation.objects.get(pk=rid).estimated_start - timezone.now()).total_seconds() / 3600
    assert 3.9 < hours <= 4.0  # nothing ended yet: the expiry

    # bob's history: 4-hour interactive reservations, each ended by him after one hour.
    day = timezone.now() - timedelta(days=1)
    for k in range(queue.RunLengths().min_samples):
        past = submitted(people["bob"], teams["nlp"], gpu_request=Decimal(1), gpu_memory_mib=1000,
                         kind="interactive", max_duration_s=4 * 3600, gpu_model="T4")
        start = day + timedelta(minutes=k)
        Reservation.objects.filter(pk=past.pk).update(
            state="succeeded", placed_at=start, expires_at=start + timedelta(hours=4),
            finished_at=start + timedelta(hours=1))
    queue.forget_learnt()
    placement_loop()
    told = alice.get(f"{URL}{rid}/").json()
    assert told["state"] == "pending" and told["estimated_start"] is not None
    hours = (Reservation.objects.get(pk=rid).estimated_start - timezone.now()).total_seconds() / 3600
    assert 0.9 < hours <= 1.0


def test_the_estimate_after_a_cycle_counts_what_that_cycle_placed(
        client_for, reservation_body, people, teams, cluster):
    """Two requests for the last T4: one cycle places the first; the second is told, by that
    cycle, when the first ends (not "now", as the cluster was before the cycle)."""
    from django.utils import timezone

    from portal.placement.cycle import run_cycle
    from portal.placement.locking import Lease
    from tests.teams import set_any_quota

    set_any_quota(teams["nlp"], share=20, gpus=20)
    set_any_quota(teams["vision"], share=20, gpus=20)
    t4s = list(Gpu.objects.filter(model="T4"))
    for gpu in t4s[1:]:  # all T4s but one held for 5 h
        running(submitted(people["bob"], teams["nlp"], gpu_request=Decimal(1), gpu_memory_mib=1000, kind="interactive",
                          max_duration_s=5 * 3600), gpu)
    alice = client_for("alice")
    first = alice.post(URL, reservation_body(gpu_model="T4", gpu_request=1.0, gpu_memory_mib=1000, kind="interactive",
                                             max_duration_s=2 * 3600), format="json").json()["id"]
    second = alice.post(URL, reservation_body(gpu_model="T4", gpu_request=1.0, gpu_memory_mib=1000),
                        format="json").json()["id"]
    run_cycle(Lease(10**9, "test"), on_bind=lambda _ids, _evicted: None)
    assert Reservation.objects.get(pk=first).state == "placed"
    row = Reservation.objects.get(pk=second)
    assert row.state == "pending" and row.queue_position == 1
    hours = (row.estimated_start - timezone.now()).total_seconds() / 3600
    assert 1.9 < hours <= 2.0  # the first one's end, not now (the snapshot before the cycle) nor in 5 h


def test_the_estimate_walks_the_work_a_team_keeps_submitting(
        client_for, reservation_body, people, teams, placement_loop):
    """Both T4s are held by vision for 1 h. nlp has submitted a 3-hour T4 job every 20 minutes
    all day: the forecast alice's estimate comes from walks nlp's next jobs too. (Under fair share
    by model, vision's T4 use is back to nothing when its T4s free, so alice still goes first there:
    the engine-level tests show a team below its share going ahead.)"""
    from datetime import timedelta

    from django.utils import timezone

    from portal.placement import queue
    from tests.teams import set_any_quota

    set_any_quota(teams["vision"], share=20, gpus=20)
    set_any_quota(teams["nlp"], share=20, gpus=20)
    for gpu in Gpu.objects.filter(model="A100-80GB"):  # vision uses more than nlp for the day
        running(submitted(people["carol"], teams["vision"], gpu_request=Decimal(1), gpu_memory_mib=1000,
                          kind="interactive", max_duration_s=24 * 3600), gpu)
    for gpu in Gpu.objects.filter(model="T4"):
        running(submitted(people["carol"], teams["vision"], gpu_request=Decimal(1), gpu_memory_mib=1000,
                          kind="interactive", max_duration_s=3600), gpu)
    alice = client_for("alice")
    rid = alice.post(URL, reservation_body(gpu_model="T4", gpu_request=1.0, gpu_memory_mib=1000),
                     format="json").json()["id"]
    placement_loop()
    row = Reservation.objects.get(pk=rid)
    assert row.state == "pending"
    hours = (row.estimated_start - timezone.now()).total_seconds() / 3600
    assert 0.9 < hours <= 1.0  # nothing learnt yet: when the T4s free

    now = timezone.now()
    for k in range(72):  # a day of nlp's work, each ran its 3 hours
        past = submitted(people["bob"], teams["nlp"], gpu_request=Decimal(1), gpu_memory_mib=1000, gpu_model="T4")
        created = now - timedelta(days=1) + timedelta(minutes=20 * k)
        Reservation.objects.filter(pk=past.pk).update(
            created_at=created, state="succeeded", placed_at=created, finished_at=created + timedelta(hours=3))
    queue.forget_learnt()
    placement_loop()
    row = Reservation.objects.get(pk=rid)
    assert row.state == "pending" and row.estimated_start is not None
    # What the forecast now expects: nlp's T4 jobs, three an hour, each for its 3 hours.
    coming = [e for e in queue.arrivals().forward(timezone.now().timestamp(), 3600) if e.request.team == "nlp"]
    assert len(coming) == 3
    assert all(e.request.gpu_model == frozenset({"T4"}) and e.run_s == 3 * 3600 for e in coming)
