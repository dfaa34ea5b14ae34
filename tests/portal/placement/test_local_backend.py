"""The simulated cluster behind the quickstart: idempotent binds, pods that move with time, one
event stream shared by every process, and node loss."""

from __future__ import annotations

import pytest

from scheduler.backends import GpuShare, PermanentBackendError, Phase, PodConflict, PodEvent, make_pod_spec
from scheduler.backends.base import Backend
from scheduler.backends.local import LocalBackend


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _spec(rid="1", attempt=1, node="n1", duration=None):
    return make_pod_spec(reservation_id=rid, attempt=attempt, namespace="tessera", node=node, team="vision",
                         image="busybox", command=("sleep", "1"), gpus=(GpuShare("GPU-a", 0, 0.5, 1.0, 4096),),
                         priority=80, kind="batch", simulated_duration_s=duration)


def test_bind_twice_adopts_and_another_reservation_cannot_take_the_name():
    cluster = LocalBackend(nodes=["n1"])
    assert isinstance(cluster, Backend)
    first = cluster.bind(_spec())
    assert cluster.bind(_spec()).uid == first.uid
    clash = _spec(rid="2")
    clash = type(clash)(**{**clash.__dict__, "name": first.name})  # same pod name, other reservation
    with pytest.raises(PodConflict):
        cluster.bind(clash)
    with pytest.raises(PermanentBackendError, match="does not exist"):
        cluster.bind(_spec(rid="3", node="nowhere"))
    assert len(cluster.list_pods()) == 1


def test_a_batch_of_binds_reports_each_outcome_in_place():
    """bind_many: new pods made, an existing one adopted, a name clash, an unknown and a NotReady
    node refused, the same pod twice in one batch made once; one event per new pod, in order."""
    cluster = LocalBackend(nodes=["n1", "n2"])
    earlier = cluster.bind(_spec(rid="1"))
    cluster.poll(0)
    cluster.set_node_ready("n2", False, "kubelet stopped")
    cluster.poll(0)
    clash = _spec(rid="9")
    clash = type(clash)(**{**clash.__dict__, "name": earlier.name})
    specs = [_spec(rid="2"), _spec(rid="1"), clash, _spec(rid="3", node="nowhere"), _spec(rid="4", node="n2"),
             _spec(rid="5"), _spec(rid="5")]
    out = cluster.bind_many(specs)
    assert [type(o).__name__ for o in out] == ["PodStatus", "PodStatus", "PodConflict", "PermanentBackendError",
                                              "PermanentBackendError", "PodStatus", "PodStatus"]
    assert out[1].uid == earlier.uid  # adopted, not made again
    assert "does not exist" in str(out[3]) and "not ready" in str(out[4])
    assert out[5].uid == out[6].uid
    assert sorted(p.reservation_id for p in cluster.list_pods()) == ["1", "2", "5"]
    made = [e.pod.reservation_id for e in cluster.poll(0) if isinstance(e, PodEvent)]
    assert made == ["2", "5"]
    assert cluster.bind_many([]) == []


def test_pods_start_then_batch_ones_finish_as_time_passes():
    clock = Clock()
    cluster = LocalBackend(nodes=["n1"], start_delay_s=2, clock=clock)
    cluster.bind(_spec(duration=10))
    assert cluster.list_pods()[0].phase == Phase.PENDING
    clock.now += 2
    assert cluster.list_pods()[0].phase == Phase.RUNNING
    clock.now += 10
    assert cluster.list_pods()[0].phase == Phase.SUCCEEDED
    phases = [e.pod.phase for e in cluster.poll(0) if isinstance(e, PodEvent)]
    assert phases == [Phase.PENDING, Phase.RUNNING, Phase.SUCCEEDED]
    assert cluster.poll(0) == []


def test_processes_share_one_cluster_and_each_event_is_delivered_once(tmp_path):
    web = LocalBackend(nodes=["n1"], state_path=tmp_path / "c.sqlite3")
    worker = LocalBackend(state_path=tmp_path / "c.sqlite3")
    web.bind(_spec())
    assert [p.name for p in worker.list_pods()] == ["tessera-r1-1"]
    assert len(worker.poll(0)) == 1 and web.poll(0) == []  # one consumer ("portal"), one cursor
    assert worker.unbind(_spec().ref, 30, "cancelled") and not web.unbind(_spec().ref, 30, "cancelled")
    [deleted] = web.poll(0)
    assert deleted.deleted and deleted.pod.message == "cancelled"


def test_lost_node_fails_its_pods_with_node_lost():
    cluster = LocalBackend(nodes=["n1", "n2"], start_delay_s=0)
    cluster.bind(_spec(rid="1", node="n1"))
    cluster.bind(_spec(rid="2", node="n2"))
    cluster.set_node_ready("n1", False, "kubelet stopped posting status")
    pods = {p.reservation_id: p for p in cluster.list_pods()}
    assert (pods["1"].phase, pods["1"].reason) == (Phase.FAILED, "NodeLost")
    assert pods["2"].phase == Phase.RUNNING
    assert [n.ready for n in cluster.list_nodes()] == [False, True]
    with pytest.raises(PermanentBackendError, match="not ready"):
        cluster.bind(_spec(rid="3", node="n1"))


def test_pod_spec_carries_the_share_to_the_preload_library():
    env = _spec().env_dict()
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a" and env["TESSERA_PRIORITY"] == "high"
    assert env["TESSERA_GPU_REQUEST"] == "0.5" and env["TESSERA_GPU_LIMIT"] == "1"
    assert env["LD_PRELOAD"].endswith("libtessera_preload.so")
    assert _spec().name == "tessera-r1-1" and _spec(attempt=2).name == "tessera-r1-2"
    with pytest.raises(ValueError, match="gpus"):
        make_pod_spec(reservation_id="1", attempt=1, namespace="t", node="n", team="t", image="i", command=(),
                      gpus=(), priority=1, kind="batch")
