"""The reservation state machine, its audit log, cancel semantics, and placement commits that
re-check GPU capacity."""


import pytest

from portal.fleet.models import Gpu
from portal.reservations import services
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import State
from tests.reservations import placed

URL = "/api/v1/reservations/"


@pytest.fixture
def submitted(client_for, fleet, reservation_body):
    def make(who="alice", **overrides):
        r = client_for(who).post(URL, reservation_body(**overrides), format="json")
        assert r.status_code == 201, r.content
        return Reservation.objects.get(pk=r.json()["id"])

    return make


def test_full_life_is_audited(submitted):
    r = submitted()
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    placed(r, gpu)
    assert services.move(r.pk, State.PLACED, State.RUNNING, "pod running", "system:watch")
    assert services.release(r.pk, State.SUCCEEDED, "exit 0", "system:watch")
    r.refresh_from_db()
    assert r.started_at and r.finished_at and r.placed_at
    assert [(t.from_state, t.to_state, t.actor_label) for t in r.transitions.all()] == [
        ("", "pending", "alice"),
        ("pending", "placed", "system:scheduler"),
        ("placed", "running", "system:watch"),
        ("running", "succeeded", "system:watch"),
    ]
    assert not Allocation.objects.filter(reservation=r, released_at__isnull=True).exists()


@pytest.mark.parametrize(("start", "target"), [
    (State.PENDING, State.RUNNING), (State.PENDING, State.SUCCEEDED), (State.PENDING, State.PREEMPTED),
])
def test_illegal_transitions_are_refused_and_not_recorded(submitted, start, target):
    r = submitted()
    assert not services.move(r.pk, start, target, "not allowed")
    r.refresh_from_db()
    assert r.state == start
    assert r.transitions.count() == 1


def test_finished_reservations_never_change_again(submitted):
    r = submitted()
    services.cancel(r.pk, "alice")
    for target in (State.PENDING, State.PLACED, State.RUNNING, State.SUCCEEDED):
        assert not services.move(r.pk, State.CANCELLED, target, "not allowed")
    r.refresh_from_db()
    assert r.state == State.CANCELLED


def test_cancel_is_idempotent_and_finished_is_409(client_for, submitted):
    alice = client_for("alice")
    r = submitted()
    first = alice.post(f"{URL}{r.pk}/cancel/")
    again = alice.post(f"{URL}{r.pk}/cancel/")
    assert first.status_code == again.status_code == 200
    assert again.json()["state"] == "cancelled"
    assert r.transitions.filter(to_state="cancelled").count() == 1

    done = submitted()
    placed(done, Gpu.objects.get(node__name="t4-node-1", index=1))
    assert services.move(done.pk, State.PLACED, State.RUNNING, "pod running")
    assert services.release(done.pk, State.SUCCEEDED, "exit 0")
    r = alice.post(f"{URL}{done.pk}/cancel/")
    assert r.status_code == 409
    assert r.json()["state"] == "succeeded"


def test_cancelling_a_running_reservation_frees_its_gpu(client_for, submitted):
    r = submitted(gpu_request=0.5, gpu_memory_mib=4096)
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    placed(r, gpu)
    gpus = client_for("admin").get("/api/v1/gpus/", {"node__name": "t4-node-1"}).json()["results"]
    assert gpus[0]["allocated_request"] == 0.5 and gpus[0]["allocated_memory_mib"] == 4096
    assert client_for("alice").post(f"{URL}{r.pk}/cancel/").status_code == 200
    gpus = client_for("admin").get("/api/v1/gpus/", {"node__name": "t4-node-1"}).json()["results"]
    assert gpus[0]["allocated_request"] == 0 and gpus[0]["allocated_memory_mib"] == 0


def test_placement_rechecks_capacity_and_writes_nothing_when_full(submitted):
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    a = submitted(gpu_request=0.75, gpu_memory_mib=1024)
    b = submitted(gpu_request=0.5, gpu_memory_mib=1024)
    placed(a, gpu)
    with pytest.raises(services.CapacityConflict):
        placed(b, gpu)
    b.refresh_from_db()
    assert b.state == State.PENDING and b.node is None
    assert not b.allocations.exists()


def test_placement_rechecks_memory(submitted):
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)  # 15360 MiB
    a = submitted(gpu_request=0.1, gpu_memory_mib=10000)
    b = submitted(gpu_request=0.1, gpu_memory_mib=6000)
    placed(a, gpu)
    with pytest.raises(services.CapacityConflict):
        placed(b, gpu)


def test_draining_node_takes_no_placement(submitted, client_for):
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    assert client_for("admin").post("/api/v1/nodes/t4-node-1/drain/", {"reason": "maintenance"},
                                    format="json").status_code == 200
    with pytest.raises(services.CapacityConflict, match="draining"):
        placed(submitted(), gpu)


def test_expiry_is_set_at_placement(submitted):
    r = submitted(max_duration_s=3600)
    placed(r, Gpu.objects.get(node__name="t4-node-1", index=0))
    r.refresh_from_db()
    assert (r.expires_at - r.placed_at).total_seconds() == 3600


def test_preempted_can_be_requeued(submitted):
    r = submitted(requeue_on_preempt=True)
    placed(r, Gpu.objects.get(node__name="t4-node-1", index=0))
    assert services.move(r.pk, State.PLACED, State.PREEMPTED, "preempted by 7", "system:scheduler")
    assert services.move(r.pk, State.PREEMPTED, State.PENDING, "requeued", "system:scheduler")
    r.refresh_from_db()
    assert r.state == State.PENDING and r.node is None


def test_history_endpoint_lists_transitions(client_for, submitted):
    r = submitted()
    client_for("alice").post(f"{URL}{r.pk}/cancel/")
    rows = client_for("carol").get(f"{URL}{r.pk}/history/").json()
    assert [row["to_state"] for row in rows] == ["pending", "cancelled"]
