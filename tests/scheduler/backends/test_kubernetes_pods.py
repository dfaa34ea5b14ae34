"""The kubernetes backend creates, adopts, lists and deletes reservation pods on a (fake) API server
that answers like the real one, faults included."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from scheduler.backends import (
    PermanentBackendError,
    Phase,
    PodConflict,
    PodRef,
    TransientBackendError,
)
from scheduler.backends.base import (
    PLACEMENT_ANNOTATION,
    REASON_ANNOTATION,
    RESERVATION_LABEL,
)
from scheduler.backends.kubernetes.manifests import SHARE_RESOURCE

PODS = r"^/api/v1/namespaces/tessera/pods$"


def test_bind_creates_one_pod_pinned_to_its_node_asking_the_device_plugin_for_its_share(nodes, backend, pod_spec):
    status = backend.bind(pod_spec())
    assert (status.name, status.node, status.phase, status.reservation_id) == (
        "tessera-r42-1", "gpu-node-1", Phase.PENDING, "42")
    assert not status.external
    (pod,) = nodes.pods()
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-node-1"
    (container,) = spec["containers"]
    # The GPU, the share, the preload library and the broker socket come from the device plugin's
    # Allocate answer (tests/agents/deviceplugin), as for kubectl pods: nothing of the node in the spec.
    assert container["resources"]["limits"] == {SHARE_RESOURCE: "1"}
    assert {e["name"]: e["value"] for e in container["env"]} == {"EPOCHS": "3"}
    assert "volumes" not in spec and "volumeMounts" not in container
    assert container["command"] == ["python", "train.py"]
    assert pod["metadata"]["labels"][RESERVATION_LABEL] == "42"
    placement = json.loads(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    assert placement["gpus"] == ["GPU-0a1b2c3d-0000-4000-8000-000000000001"]
    assert (placement["request"], placement["limit"], placement["memory_mib"]) == (0.25, 0.5, 8192)
    assert spec["restartPolicy"] == "Never" and spec["runtimeClassName"] == "nvidia"
    assert nodes.validated >= 1  # and the fixture fails the test on any invalid manifest


def test_a_user_cannot_override_the_share_through_the_pods_env(nodes, backend, pod_spec):
    spec = pod_spec()
    spec = replace(spec, env=(*spec.env, ("LD_PRELOAD", "/tmp/mine.so"), ("TESSERA_GPU_LIMIT", "1")))
    backend.bind(spec)
    (pod,) = nodes.pods()
    assert {e["name"] for e in pod["spec"]["containers"][0]["env"]} == {"EPOCHS"}


def test_the_pods_pass_pod_security_baseline(nodes, backend, pod_spec):
    nodes.add_namespace("tessera-workloads", {"pod-security.kubernetes.io/enforce": "baseline"})
    status = backend.bind(pod_spec(namespace="tessera-workloads"))
    assert status.namespace == "tessera-workloads"


def test_interactive_pods_restart_and_run_the_images_own_command(nodes, backend, pod_spec):
    backend.bind(pod_spec(kind="interactive", command=()))
    (pod,) = nodes.pods()
    assert pod["spec"]["restartPolicy"] == "Always"
    assert "command" not in pod["spec"]["containers"][0]


def test_a_retried_bind_adopts_the_existing_pod_and_never_makes_two(nodes, backend, pod_spec):
    first = backend.bind(pod_spec())
    again = backend.bind(pod_spec())
    assert again.uid == first.uid
    assert len(nodes.pods()) == 1


def test_a_create_whose_answer_was_lost_is_retried_and_adopted(nodes, backend, pod_spec):
    nodes.inject("POST", PODS, status=500, after=True)  # created, then the answer is a 500
    status = backend.bind(pod_spec())
    assert len(nodes.calls("POST", PODS)) == 2
    (pod,) = nodes.pods()
    assert status.uid == pod["metadata"]["uid"]


def test_a_create_that_times_out_is_retried_and_adopted(nodes, backend, pod_spec):
    nodes.inject("POST", PODS, delay_s=1.6, after=True)  # longer than the client's 1 s read timeout
    status = backend.bind(pod_spec())
    (pod,) = nodes.pods()
    assert status.uid == pod["metadata"]["uid"]


def test_server_errors_for_a_while_are_retried_with_backoff(nodes, backend, pod_spec):
    nodes.inject("POST", PODS, status=500, times=2)
    nodes.inject("GET", r"/api/v1/nodes/gpu-node-1$", status=503, times=1)
    backend.bind(pod_spec())
    assert len(nodes.calls("POST", PODS)) == 3
    assert len(nodes.pods()) == 1


def test_an_api_server_down_longer_than_the_retries_is_a_transient_error_and_leaves_nothing(
        nodes, backend, pod_spec):
    nodes.inject("POST", PODS, status=500, times=10)
    with pytest.raises(TransientBackendError, match="HTTP 500"):
        backend.bind(pod_spec())
    assert nodes.pods() == []


def test_an_unreachable_api_server_is_a_transient_error(make_backend, pod_spec):
    backend = make_backend(host="http://127.0.0.1:9",  # discard port: nothing listens
                           retry=dict(attempts=4, base_s=0.01, max_s=0.05, probe_s=0.05, outage_s=0.3))
    with pytest.raises(TransientBackendError, match=r"did not answer for 0\.3 s \(.*Connection refused"):
        backend.bind(pod_spec())


def test_a_pod_name_held_by_another_reservation_is_a_conflict(nodes, backend, pod_spec):
    backend.bind(pod_spec(reservation_id="42"))
    other = pod_spec(reservation_id="43")
    other = type(other)(**{**other.__dict__, "name": "tessera-r42-1"})
    with pytest.raises(PodConflict, match="reservation '42', not '43'"):
        backend.bind(other)


def test_a_pod_of_ours_still_terminating_is_retried_later(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    nodes.hold_deletions = True
    backend.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=30, reason="preempted")
    with pytest.raises(TransientBackendError, match="terminating"):
        backend.bind(pod_spec())


def test_an_unknown_node_or_namespace_is_permanent(nodes, backend, pod_spec):
    with pytest.raises(PermanentBackendError, match="node 'gpu-node-9' does not exist"):
        backend.bind(pod_spec(node="gpu-node-9"))
    with pytest.raises(PermanentBackendError, match="namespace 'nowhere' does not exist"):
        backend.bind(pod_spec(namespace="nowhere"))
    assert nodes.pods() == []


def test_a_team_name_kubernetes_cannot_hold_as_a_label_is_refused_before_anything_is_sent(
        nodes, backend, pod_spec):
    with pytest.raises(PermanentBackendError, match="not a valid Kubernetes label value"):
        backend.bind(pod_spec(team="Vision & Speech"))
    assert nodes.calls("POST", PODS) == []


def test_unbind_deletes_gracefully_with_the_reason_and_is_idempotent(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    nodes.hold_deletions = True
    assert backend.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=20, reason="preempted by 51") is True
    pod = nodes.pod("tessera", "tessera-r42-1")
    assert pod["metadata"]["annotations"][REASON_ANNOTATION] == "preempted by 51"
    (delete,) = nodes.calls("DELETE", r"/pods/tessera-r42-1$")
    assert delete.query["gracePeriodSeconds"] == "20"
    # Terminating: left alone, and the first reason stays.
    assert backend.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=20, reason="no live reservation") is False
    assert len(nodes.calls("DELETE", r"/pods/tessera-r42-1$")) == 1
    assert len(nodes.calls("PATCH", r"/pods/tessera-r42-1$")) == 1
    assert nodes.pod("tessera", "tessera-r42-1")["metadata"]["annotations"][REASON_ANNOTATION] == "preempted by 51"
    nodes.finish_deletion("tessera", "tessera-r42-1")
    assert backend.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=20, reason="again") is False


def test_another_process_leaves_a_terminating_pod_alone_once_its_watch_saw_it(nodes, make_backend, pod_spec):
    first, other = make_backend(), make_backend()
    first.bind(pod_spec())
    nodes.hold_deletions = True
    other.poll(0.5)  # its watch runs and knows the pod
    assert first.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=20, reason="cancelled") is True
    deadline = time.monotonic() + 5
    while not (seen := other.watch.seen_pod("tessera", "tessera-r42-1")) or not seen.deleting:
        assert time.monotonic() < deadline
        other.poll(0.2)
    assert other.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=20, reason="reservation 42 is cancelled") is False
    assert len(nodes.calls("DELETE", r"/pods/tessera-r42-1$")) == 1
    assert nodes.pod("tessera", "tessera-r42-1")["metadata"]["annotations"][REASON_ANNOTATION] == "cancelled"


def test_unbind_survives_errors_and_a_lost_answer(nodes, backend, pod_spec):
    backend.bind(pod_spec())
    nodes.inject("DELETE", r"/pods/tessera-r42-1$", status=500, after=True)
    # Deleted on the first try, the answer lost; the retry finds nothing, and that is fine.
    assert backend.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=5, reason="cancelled") is False
    assert nodes.pods() == []


def test_list_pods_reports_ours_and_bound_kubectl_pods_across_pages(nodes, backend, pod_spec):
    for i in range(3):
        backend.bind(pod_spec(reservation_id=str(100 + i)))
    for i in range(520):  # more than one page
        nodes.create_pod({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": f"user-{i}", "namespace": "team-vision",
                                       "labels": {RESERVATION_LABEL: str(1000 + i)}},
                          "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]}})
    nodes.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unrelated", "namespace": "default"},
                      "spec": {"containers": [{"name": "c", "image": "x"}]}})
    pods = backend.list_pods()
    assert len(pods) == 523
    assert {p.reservation_id for p in pods if not p.external} == {"100", "101", "102"}
    assert sum(p.external for p in pods) == 520
    assert len(nodes.calls("GET", r"^/api/v1/pods$")) == 2


def test_list_nodes_reports_readiness(nodes, backend):
    nodes.set_node_ready("gpu-node-2", False)
    assert {(n.name, n.ready) for n in backend.list_nodes()} == {("gpu-node-1", True), ("gpu-node-2", False)}


def test_the_portal_builds_it_by_name_and_a_missing_cluster_config_is_a_clear_error(tmp_path, monkeypatch):
    from scheduler.backends import create

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(PermanentBackendError, match="set KUBECONFIG"):
        create("kubernetes", namespace="tessera")


def test_the_backend_reuses_its_connections(nodes, backend, pod_spec):
    for i in range(15):
        backend.bind(pod_spec(reservation_id=str(i)))
        backend.bind(pod_spec(reservation_id=str(i)))  # adopt
    backend.list_pods()
    # Every answer is read and the connection handed back to the pool: a handful, not one per call.
    assert nodes.connections <= 4


def test_it_speaks_the_whole_backend_contract(backend):
    from scheduler.backends import Backend

    assert isinstance(backend, Backend) and backend.name == "kubernetes"


def test_bind_many_creates_every_pod_once_side_by_side_and_reports_each_failure_in_place(nodes, make_backend,
                                                                                         pod_spec):
    # A read timeout far above the answer time: on a loaded machine a 1 s timeout fired, the client
    # retried while the server still answered the first request, and the count went over the limit.
    backend = make_backend(retry=dict(attempts=4, base_s=0.01, max_s=0.05, connect_timeout_s=5.0,
                                      read_timeout_s=30.0))
    specs = [pod_spec(reservation_id=str(i)) for i in range(24)]
    specs[5] = pod_spec(reservation_id="5", node="gpu-node-9")  # no such node: permanent, alone
    nodes.inject("POST", PODS, status=500, times=2)  # retried inside, as for one bind
    nodes.answer_delay_s = 0.02
    outcomes = backend.bind_many(specs)
    assert 1 < nodes.max_in_flight <= backend.bind_concurrency
    assert isinstance(outcomes[5], PermanentBackendError) and "gpu-node-9" in str(outcomes[5])
    ok = [o for i, o in enumerate(outcomes) if i != 5]
    assert [o.reservation_id for o in ok] == [str(i) for i in range(24) if i != 5]  # in the order given
    assert sorted(p["metadata"]["name"] for p in nodes.pods()) == sorted(f"tessera-r{i}-1" for i in range(24) if i != 5)
    # Run again (a retried task): every pod adopted, none made twice.
    again = backend.bind_many(specs)
    assert [o.uid for i, o in enumerate(again) if i != 5] == [o.uid for o in ok]
    assert len(nodes.pods()) == 23


def test_bind_many_reads_each_node_once_per_batch(nodes, backend, pod_spec):
    specs = [pod_spec(reservation_id=str(i), node=f"gpu-node-{1 + i % 2}") for i in range(20)]
    before = len(nodes.calls("GET", r"^/api/v1/nodes/"))
    outcomes = backend.bind_many(specs)
    assert all(o.node in ("gpu-node-1", "gpu-node-2") for o in outcomes)
    assert len(nodes.calls("GET", r"^/api/v1/nodes/")) - before == 2  # not 20
    # A node that cannot be read for now fails its own pods as transient (retried), not the others.
    nodes.inject("GET", r"^/api/v1/nodes/gpu-node-2$", status=503, times=20)
    more = [pod_spec(reservation_id=str(i), node=f"gpu-node-{1 + i % 2}") for i in range(20, 24)]
    outcomes = backend.bind_many(more)
    assert [type(o).__name__ for o in outcomes] == ["PodStatus", "TransientBackendError"] * 2
