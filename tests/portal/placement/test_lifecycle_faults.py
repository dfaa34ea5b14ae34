"""After placement: expiry with a warning, idle reclaim from measured use, lost nodes, pods deleted
from outside, reconcile after a worker died mid-bind, and an API server that fails for a while."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from portal.fleet.models import Node, NodeStatus
from portal.placement import binding, expiry, tasks
from portal.placement import idle as idle_module
from portal.placement.idle import check_idle
from portal.placement.reconcile import reconcile
from portal.reservations.models import Allocation, Kind, Reservation
from portal.reservations.states import State
from portal.telemetry.models import ShareSample
from scheduler.backends import GpuShare, PodRef, TransientBackendError, make_pod_spec


def _submit(client, body) -> int:
    response = client.post("/api/v1/reservations/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _running(client_for, reservation_body, placement_loop, **body) -> Reservation:
    rid = _submit(client_for("alice"), reservation_body(**body))
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.RUNNING, r.state_reason
    return r


class Clock:
    """What the lifecycle checks take for now: time passes without writing to the reservations."""

    def __init__(self) -> None:
        self.at = timezone.now()

    def now(self):
        return self.at


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(expiry, "timezone", c)
    monkeypatch.setattr(idle_module, "timezone", c)
    return c


def test_interactive_reservation_is_warned_then_expires_and_its_pod_goes(client_for, reservation_body, cluster,
                                                                         placement_loop, clock):
    r = _running(client_for, reservation_body, placement_loop, kind=Kind.INTERACTIVE, gpu_request=0.5,
                 gpu_memory_mib=4096)
    # Interactive without a duration: the team's limit sets its end.
    lasts = r.expires_at - r.placed_at
    assert abs(lasts - timedelta(seconds=r.team.interactive_max_s)) < timedelta(seconds=5)
    # Five minutes left of an eight-hour session: time to warn (once).
    clock.at = r.expires_at - timedelta(minutes=5)
    assert expiry.expire_due(cluster) == (0, 1)
    assert expiry.expire_due(cluster) == (0, 0)
    body = client_for("alice").get(f"/api/v1/reservations/{r.pk}/").json()
    assert body["state"] == "running" and body["expiry_warned_at"] is not None
    clock.at = r.expires_at + timedelta(seconds=1)
    assert expiry.expire_due(cluster) == (1, 0)
    r.refresh_from_db()
    assert r.state == State.EXPIRED and "end time" in r.state_reason
    assert r.pod_name not in {p.name for p in cluster.list_pods()}
    assert not Allocation.objects.filter(reservation=r, released_at__isnull=True).exists()


def _samples(r: Reservation, used: float, minutes: int, now) -> None:
    gpu = r.allocations.get().gpu
    ShareSample.objects.bulk_create(
        ShareSample(reservation=r, gpu=gpu, ts=now - timedelta(seconds=s), used_frac=used)
        for s in range(0, minutes * 60, 10))


def test_idle_reservation_is_flagged_and_reclaimed_when_team_says_so(client_for, reservation_body, cluster,
                                                                     placement_loop, teams, clock):
    team = teams["vision"]
    team.idle_threshold, team.idle_after_s, team.idle_reclaim = Decimal("0.05"), 600, False
    team.save()
    idle = _running(client_for, reservation_body, placement_loop, gpu_request=0.25, gpu_memory_mib=2048)
    busy = _running(client_for, reservation_body, placement_loop, gpu_request=0.25, gpu_memory_mib=2048)
    unmeasured = _running(client_for, reservation_body, placement_loop, gpu_request=0.25, gpu_memory_mib=2048)
    clock.at = timezone.now() + timedelta(hours=1)  # an hour later, with the last 12 minutes measured
    _samples(idle, 0.01, 12, clock.at)
    _samples(busy, 0.20, 12, clock.at)
    assert check_idle(cluster) == (1, 0)
    idle.refresh_from_db()
    assert idle.state == State.RUNNING and idle.idle_since is not None
    assert Reservation.objects.get(pk=busy.pk).idle_since is None
    assert Reservation.objects.get(pk=unmeasured.pk).idle_since is None  # no data is not idleness
    team.idle_reclaim = True
    team.save()
    assert check_idle(cluster) == (0, 0)  # reclaim comes only after the warning period
    clock.at += timedelta(seconds=team.idle_warning_s)
    _samples(idle, 0.01, 12, clock.at)
    _samples(busy, 0.20, 12, clock.at)
    assert check_idle(cluster) == (0, 1)
    idle.refresh_from_db()
    assert idle.state == State.EXPIRED and "reclaimed" in idle.state_reason and "1.0%" in idle.state_reason
    assert "15 min after the warning" in idle.state_reason
    assert Reservation.objects.get(pk=busy.pk).state == State.RUNNING


def test_idle_reclaim_waits_the_teams_warning_period_and_use_meanwhile_cancels_it(
        client_for, reservation_body, cluster, placement_loop, teams, people, clock):
    from portal.audit import services as audit
    from portal.reservations import services
    from portal.tenancy import policy

    team = teams["vision"]
    policy.set_policy(team, audit.web(people["carol"]), {"idle_threshold": "0.05", "idle_after_s": 600,
                                                         "idle_reclaim": True, "idle_warning_s": 1800})
    team.refresh_from_db()
    idle = _running(client_for, reservation_body, placement_loop, gpu_request=0.25, gpu_memory_mib=2048)
    woken = _running(client_for, reservation_body, placement_loop, gpu_request=0.25, gpu_memory_mib=2048)
    clock.at = timezone.now() + timedelta(hours=1)
    for r in (idle, woken):
        _samples(r, 0.01, 12, clock.at)
    assert check_idle(cluster) == (2, 0)  # both warned
    idle.refresh_from_db()
    warned_at = idle.idle_since
    assert services.idle_reclaim_at(warned_at, team) == warned_at + timedelta(minutes=30)
    # 29 minutes on, still idle: not yet
    clock.at = warned_at + timedelta(minutes=29)
    for r in (idle, woken):
        _samples(r, 0.01, 12, clock.at)
    assert check_idle(cluster) == (0, 0)
    # the owner of `woken` uses it again: the warning goes with the flag
    _samples(woken, 0.5, 12, clock.at + timedelta(minutes=1))
    _samples(idle, 0.01, 12, clock.at + timedelta(minutes=1))
    clock.at += timedelta(minutes=1)
    assert check_idle(cluster) == (0, 1)
    assert Reservation.objects.get(pk=idle.pk).state == State.EXPIRED
    woken.refresh_from_db()
    assert woken.state == State.RUNNING and woken.idle_since is None


def test_lost_node_requeues_or_fails_by_team_policy(client_for, reservation_body, cluster, placement_loop, teams):
    teams["nlp"].requeue_on_node_lost = False
    teams["nlp"].save()
    requeued = _running(client_for, reservation_body, placement_loop, gpu_model="T4", gpu_request=0.5,
                        gpu_memory_mib=4096)
    bob_id = _submit(client_for("bob"), reservation_body(team="nlp", gpu_model="T4", gpu_request=0.5,
                                                         gpu_memory_mib=4096))
    placement_loop()
    cluster.set_node_ready("t4-node-1", False, "kubelet stopped posting status")
    placement_loop()
    node = Node.objects.get(name="t4-node-1")
    assert node.status == NodeStatus.LOST and "kubelet stopped" in node.status_reason
    requeued.refresh_from_db()
    assert requeued.state == State.PENDING
    assert requeued.transitions.last().reason == "requeued: node t4-node-1 is not ready"
    failed = Reservation.objects.get(pk=bob_id)
    assert failed.state == State.FAILED and "t4-node-1" in failed.state_reason
    assert not Allocation.objects.filter(gpu__node=node, released_at__isnull=True).exists()
    # The node comes back: the requeued reservation runs again, under a new pod name.
    cluster.set_node_ready("t4-node-1", True)
    placement_loop()
    placement_loop()
    requeued.refresh_from_db()
    assert Node.objects.get(name="t4-node-1").status == NodeStatus.READY
    assert requeued.state == State.RUNNING and requeued.attempt == 2 and requeued.pod_name.endswith("-2")


def test_pod_deleted_outside_tessera_fails_the_reservation(client_for, reservation_body, cluster, placement_loop):
    r = _running(client_for, reservation_body, placement_loop, gpu_request=0.5, gpu_memory_mib=4096)
    cluster.unbind(PodRef(r.pod_namespace, r.pod_name), 0, "kubectl delete pod")
    placement_loop()
    r.refresh_from_db()
    assert r.state == State.FAILED and "deleted outside Tessera" in r.state_reason


def test_reconcile_binds_what_a_dead_worker_left_and_removes_orphans(client_for, reservation_body, cluster,
                                                                     placement_loop):
    vanished = _running(client_for, reservation_body, placement_loop, gpu_request=0.25, gpu_memory_mib=2048)
    alice = client_for("alice")
    rid = _submit(alice, reservation_body(gpu_request=0.5, gpu_memory_mib=4096))
    # The cycle commits, but the worker dies before the bind task runs: no callbacks executed.
    tasks.run_cycles("worker dies")
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.PLACED and r.pod_name not in {p.name for p in cluster.list_pods()}
    # A pod nobody owns any more (its reservation is long gone) and a running one whose pod vanished.
    orphan = make_pod_spec(reservation_id="999999", attempt=1, namespace="tessera", node="t4-node-1", team="x",
                           image="busybox", command=(), gpus=(GpuShare("GPU-x", 0, 0.1, 0.1, 10),), priority=1,
                           kind="batch")
    cluster.bind(orphan)
    cluster.unbind(PodRef(vanished.pod_namespace, vanished.pod_name), 0, "lost with its node's disk")
    cluster.poll(0)  # these events are lost (the watcher was down)

    report = reconcile(cluster)
    assert report.rebound == [rid] and report.failed == [vanished.pk]
    assert report.deleted == [f"tessera/{orphan.name}"]
    pods = {p.name: p for p in cluster.list_pods()}
    assert r.pod_name in pods and orphan.name not in pods
    assert Reservation.objects.get(pk=vanished.pk).state == State.FAILED
    # Reconcile again: nothing left to do but to notice the pod runs; still one pod per reservation.
    again = reconcile(cluster)
    assert (again.rebound, again.deleted, again.failed) == ([], [], [])
    assert Reservation.objects.get(pk=rid).state == State.RUNNING
    assert sum(1 for p in cluster.list_pods() if p.reservation_id == str(rid)) == 1


class FlakyBackend:
    """The local cluster behind an API server that fails the first `failures` binds (500, timeouts)."""

    def __init__(self, inner, failures: int):
        self.inner, self.failures, self.calls = inner, failures, 0

    def bind(self, spec):
        self.calls += 1
        if self.calls <= self.failures:
            # Half the time the pod was created before the answer was lost, as with a timeout.
            if self.calls % 2 == 0:
                self.inner.bind(spec)
            raise TransientBackendError("500 Internal Server Error")
        return self.inner.bind(spec)

    def bind_many(self, specs):
        out = []
        for spec in specs:
            try:
                out.append(self.bind(spec))
            except TransientBackendError as exc:
                out.append(exc)
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_bind_retries_through_api_errors_and_never_makes_two_pods(client_for, reservation_body, cluster,
                                                                   placement_loop, monkeypatch):
    flaky = FlakyBackend(cluster, failures=3)
    monkeypatch.setattr(tasks, "get_backend", lambda: flaky)
    rid = _submit(client_for("alice"), reservation_body(gpu_request=0.5, gpu_memory_mib=4096))
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert flaky.calls == 4
    assert r.state == State.RUNNING
    assert [p.name for p in cluster.list_pods() if p.reservation_id == str(rid)] == [r.pod_name]


def test_bind_of_reservation_cancelled_meanwhile_creates_nothing(client_for, reservation_body, cluster):
    rid = _submit(client_for("alice"), reservation_body(gpu_request=0.5, gpu_memory_mib=4096))
    tasks.run_cycles("placed")
    assert client_for("alice").post(f"/api/v1/reservations/{rid}/cancel/", {}, format="json").status_code == 200
    assert binding.bind(cluster, rid) is None
    assert cluster.list_pods() == []
