"""Placement cycles on the simulated cluster: submit → placed → pod → running, with reasons,
queue positions, preemption and gangs."""

from __future__ import annotations

from portal.reservations import rules, services
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import State
from scheduler.backends import Phase, PodEvent, PodRef
from tests.invariants import live_shares_ok
from tests.teams import set_any_quota


def _submit(client, body) -> int:
    response = client.post("/api/v1/reservations/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def test_submitted_reservation_runs_with_its_share_on_the_gpu(client_for, reservation_body, cluster, placement_loop):
    alice = client_for("alice")
    rid = _submit(alice, reservation_body(gpu_request=0.25, gpu_limit=0.5, gpu_memory_mib=8192, gpu_model="T4"))
    placement_loop()
    body = alice.get(f"/api/v1/reservations/{rid}/").json()
    assert body["state"] == "running", body
    assert body["node"] == "t4-node-1"
    [alloc] = body["allocations"]
    pods = {p.name: p for p in cluster.list_pods()}
    r = Reservation.objects.get(pk=rid)
    assert r.pod_name == f"tessera-r{rid}-1" and pods[r.pod_name].phase == Phase.RUNNING
    assert r.pod_uid == pods[r.pod_name].uid
    env = cluster.pod_env(PodRef(r.pod_namespace, r.pod_name))
    assert env["NVIDIA_VISIBLE_DEVICES"] == alloc["gpu_uuid"]
    assert env["TESSERA_GPU_REQUEST"] == "0.25" and env["TESSERA_GPU_LIMIT"] == "0.5"
    assert env["TESSERA_GPU_MEMORY_LIMIT"] == "8192Mi" and env["TESSERA_SHARE_ID"] == str(rid)
    assert [t.to_state for t in r.transitions.all()] == ["pending", "placed", "running"]


def test_request_that_does_not_fit_waits_with_reason_and_queue_position(client_for, reservation_body, cluster,
                                                                         placement_loop):
    alice = client_for("alice")
    # Two T4s of 15 GiB: 2 × 12 GiB fit, the third and fourth do not.
    ids = [_submit(alice, reservation_body(gpu_request=0.3, gpu_memory_mib=12_000, gpu_model="T4"))
           for _ in range(4)]
    placement_loop()
    states = {rid: alice.get(f"/api/v1/reservations/{rid}/").json() for rid in ids}
    running = [rid for rid, b in states.items() if b["state"] == "running"]
    waiting = [b for b in states.values() if b["state"] == "pending"]
    assert len(running) == 2 and len(waiting) == 2
    for b in waiting:
        assert "memory" in b["state_reason"].lower(), b["state_reason"]
    assert sorted(b["queue_position"] for b in waiting) == [1, 2]
    assert live_shares_ok() == []


def test_cancelled_running_reservation_frees_gpu_and_deletes_pod(client_for, reservation_body, cluster,
                                                                 placement_loop):
    whole_t4 = dict(gpu_request=1.0, gpu_memory_mib=15_000, gpu_model="T4")
    alice = client_for("alice")
    ids = [_submit(alice, reservation_body(**whole_t4)) for _ in range(2)]
    ids.append(_submit(client_for("bob"), reservation_body(team="nlp", **whole_t4)))
    placement_loop()
    by_state = {s: [r for r in Reservation.objects.filter(pk__in=ids) if r.state == s]
                for s in (State.RUNNING, State.PENDING)}
    assert len(by_state[State.RUNNING]) == 2 and len(by_state[State.PENDING]) == 1  # two T4s
    [waiting] = by_state[State.PENDING]
    mine = next(r for r in by_state[State.RUNNING] if r.owner.username == "alice")
    assert alice.post(f"/api/v1/reservations/{mine.pk}/cancel/", {}, format="json").status_code == 200
    placement_loop()
    assert mine.pod_name not in {p.name for p in cluster.list_pods()}
    assert Reservation.objects.get(pk=waiting.pk).state == State.RUNNING
    assert not Allocation.objects.filter(reservation_id=mine.pk, released_at__isnull=True).exists()
    assert live_shares_ok() == []


def test_high_priority_preempts_opportunistic_which_is_requeued(client_for, reservation_body, cluster,
                                                                placement_loop):
    alice, bob = client_for("alice"), client_for("bob")
    victims = [_submit(alice, reservation_body(gpu_request=1.0, gpu_memory_mib=15_000, gpu_model="T4", priority=0,
                                               requeue_on_preempt=True)) for _ in range(2)]
    placement_loop()
    victim_pods = {Reservation.objects.get(pk=v).pod_name for v in victims}
    urgent = _submit(bob, reservation_body(team="nlp", gpu_request=0.5, gpu_memory_mib=8000, gpu_model="T4",
                                           priority=90))
    placement_loop()
    # The victim's pod was deleted before the preemptor's pod was created: they never share the GPU.
    pods = {p.name for p in cluster.list_pods()}
    [gone] = victim_pods - pods
    urgent_pod = Reservation.objects.get(pk=urgent).pod_name
    assert urgent_pod in pods
    history = [(e.pod.name, e.deleted) for e in cluster.history() if isinstance(e, PodEvent)]
    deleted_at = next(i for i, (name, deleted) in enumerate(history) if name == gone and deleted)
    created_at = next(i for i, (name, _) in enumerate(history) if name == urgent_pod)
    assert deleted_at < created_at
    placement_loop()
    assert Reservation.objects.get(pk=urgent).state == State.RUNNING
    evicted = [Reservation.objects.get(pk=v) for v in victims]
    requeued = [r for r in evicted if r.state == State.PENDING]
    assert len(requeued) == 1
    transitions = [t.to_state for t in requeued[0].transitions.all()]
    assert transitions[-2:] == ["preempted", "pending"]
    assert f"preempted by reservation {urgent}" in requeued[0].transitions.get(to_state="preempted").reason
    assert requeued[0].state_reason  # it says why it waits
    assert len(victim_pods - {p.name for p in cluster.list_pods()}) == 1  # the victim's pod is gone
    assert live_shares_ok() == []


def test_batch_pod_that_completes_makes_reservation_succeed(settings, client_for, reservation_body, cluster,
                                                            placement_loop):
    settings.TESSERA_LOCAL_BATCH_S = 0.0
    rid = _submit(client_for("alice"), reservation_body(gpu_request=0.5, gpu_memory_mib=4096))
    placement_loop()
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.SUCCEEDED, r.state_reason
    assert "completed" in r.state_reason
    assert not Allocation.objects.filter(reservation=r, released_at__isnull=True).exists()


def test_gang_is_placed_whole_or_not_at_all(client_for, reservation_body, cluster, placement_loop):
    alice = client_for("alice")
    # Three members of 10 GB each need three T4s; there are two.
    gang = dict(gpu_model="T4", gpu_request=0.6, gpu_memory_mib=10_000, group_name="g1", group_headcount=3)
    ids = [_submit(alice, reservation_body(**gang)) for _ in range(3)]
    placement_loop()
    states = {Reservation.objects.get(pk=i).state for i in ids}
    assert states == {State.PENDING}, states  # only two T4s: none of the three may start
    assert Allocation.objects.filter(released_at__isnull=True).count() == 0
    assert all(Reservation.objects.get(pk=i).state_reason for i in ids)


def test_a_burst_larger_than_one_commit_is_placed_in_batches_and_every_pod_made(
        people, teams, cluster, django_capture_on_commit_callbacks, monkeypatch):
    """250 reservations pending at once: committed in batches that start small and double up to
    BATCH_DECISIONS, each batch's binds sent after its commit, every pod made once, no GPU
    over-committed; the first batch commits before the engine has made its last decision."""
    from decimal import Decimal

    from portal.fleet.models import Gpu
    from portal.placement import commit, cycle, tasks

    binds: list[list[int]] = []
    real_enqueue = tasks.enqueue_binds
    monkeypatch.setattr(tasks, "enqueue_binds",
                        lambda ids, evicted: (binds.append(list(ids)), real_enqueue(ids, evicted)))
    monkeypatch.setattr(commit, "FIRST_BATCH", 25)
    monkeypatch.setattr(commit, "BATCH_DECISIONS", 100)
    events: list[str] = []
    real_decide, real_place_many = cycle.core.decide, commit.services.place_many

    def decide(*args, **kwargs):
        for decision in real_decide(*args, **kwargs):
            events.append("decided")
            yield decision

    def place_many(units, *args, **kwargs):
        events.append(f"committing {len(units)}")
        return real_place_many(units, *args, **kwargs)

    monkeypatch.setattr(cycle.core, "decide", decide)
    monkeypatch.setattr(commit.services, "place_many", place_many)
    # 250 submitted before any cycle runs (their cycle requests wait for a commit that never comes).
    vision = teams["vision"]
    set_any_quota(vision, share=20, memory_mib=10**6, gpus=1000)
    ids = [services.submit(people["alice"], rules.ReservationSpec(
        team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.05"), gpu_memory_mib=64)).pk
        for _ in range(250)]
    assert Gpu.objects.count() * 20 >= 250  # 0.05 each: every one fits
    with django_capture_on_commit_callbacks(execute=True):
        tasks.run_cycles("burst")
    assert [len(b) for b in binds] == [25, 50, 100, 75]
    assert [e for e in events if e != "decided"] == ["committing 25", "committing 50", "committing 100",
                                                    "committing 75"]
    assert events.index("committing 25") == 25  # right after the 25th decision, not after the 250th
    assert sorted(rid for batch in binds for rid in batch) == ids
    placed = Reservation.objects.filter(pk__in=ids)
    assert set(placed.values_list("state", flat=True)) <= {State.PLACED, State.RUNNING}
    pods = [p for p in cluster.list_pods() if p.reservation_id is not None]
    assert sorted(int(p.reservation_id) for p in pods) == ids  # one pod each, none twice
    assert dict(placed.values_list("pk", "pod_uid")) == {int(p.reservation_id): p.uid for p in pods}
    assert live_shares_ok() == []
    assert Allocation.objects.filter(reservation_id__in=ids, released_at__isnull=True).count() == 250
