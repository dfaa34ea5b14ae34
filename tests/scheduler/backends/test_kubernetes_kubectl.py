"""The kubectl path on the cluster side: pods that users create with `schedulerName: tessera` and
KubeShare labels are listed, bound through the Binding subresource, or told why not with an Event."""

from __future__ import annotations

import json

import pytest

from scheduler.backends import GpuShare, PodConflict, PodRef
from scheduler.backends.base import PLACEMENT_ANNOTATION, RESERVATION_LABEL, external_binding

BINDING = r"/pods/notebook/binding$"


def user_pod(name="notebook", namespace="team-vision", scheduler="tessera", node=None, **labels):
    labels = {"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_limit": "1.0", "sharedgpu/gpu_mem": "4294967296",
              **labels}
    spec = {"schedulerName": scheduler, "containers": [{"name": "nb", "image": "jupyter/base:2025"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": spec}


def placement(reservation_id="77"):
    share = GpuShare(uuid="GPU-0a1b2c3d-0000-4000-8000-000000000002", index=1, gpu_request=0.5, gpu_limit=1.0,
                     gpu_memory_mib=4096)
    return external_binding(reservation_id, "vision", (share,), priority=10)


def test_only_unbound_pods_asking_for_tessera_are_pending(nodes, backend, pod_spec):
    nodes.create_pod(user_pod("first"))
    nodes.create_pod(user_pod("second", namespace="default", **{"sharedgpu/priority": "80"}))
    nodes.create_pod(user_pod("other-scheduler", scheduler="default-scheduler"))
    nodes.create_pod(user_pod("already-bound", node="gpu-node-1"))
    backend.bind(pod_spec())  # our own pods never count as external
    pending = backend.list_pending_external()
    assert sorted((p.namespace, p.name) for p in pending) == [("default", "second"), ("team-vision", "first")]
    assert pending == sorted(pending, key=lambda p: p.created_at)  # oldest first
    second = next(p for p in pending if p.name == "second")
    assert second.labels["sharedgpu/priority"] == "80" and second.image == "jupyter/base:2025"
    assert second.uid and second.created_at > 0


def test_binding_puts_the_placement_on_the_pod_then_binds_it_to_the_node(nodes, backend):
    nodes.create_pod(user_pod())
    labels, annotations = placement()
    backend.bind_external(PodRef("team-vision", "notebook"), "gpu-node-2", labels, annotations)
    pod = nodes.pod("team-vision", "notebook")
    assert pod["spec"]["nodeName"] == "gpu-node-2"
    assert pod["metadata"]["labels"][RESERVATION_LABEL] == "77"
    assert pod["metadata"]["labels"]["sharedgpu/gpu_request"] == "0.5"  # the user's labels stay
    assert json.loads(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION])["gpus"] == [
        "GPU-0a1b2c3d-0000-4000-8000-000000000002"]
    (binding,) = nodes.calls("POST", BINDING)
    assert binding.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-2"}
    assert backend.list_pending_external() == []
    (listed,) = backend.list_pods()
    assert listed.external and listed.reservation_id == "77"


def test_a_binding_whose_answer_was_lost_is_success_on_retry(nodes, backend):
    nodes.create_pod(user_pod())
    nodes.inject("POST", BINDING, status=500, after=True)
    backend.bind_external(PodRef("team-vision", "notebook"), "gpu-node-2", *placement())
    assert len(nodes.calls("POST", BINDING)) == 2  # the retry met 409 "already assigned": ours
    assert nodes.pod("team-vision", "notebook")["spec"]["nodeName"] == "gpu-node-2"
    # And a whole second call (a retried task) is a no-op success.
    backend.bind_external(PodRef("team-vision", "notebook"), "gpu-node-2", *placement())
    assert len(nodes.calls("POST", BINDING)) == 2


def test_a_pod_bound_elsewhere_or_gone_is_a_conflict(nodes, backend):
    nodes.create_pod(user_pod(node="gpu-node-1"))
    with pytest.raises(PodConflict, match="bound to gpu-node-1, not gpu-node-2"):
        backend.bind_external(PodRef("team-vision", "notebook"), "gpu-node-2", *placement())
    nodes.remove_pod("team-vision", "notebook")
    with pytest.raises(PodConflict, match="gone"):
        backend.bind_external(PodRef("team-vision", "notebook"), "gpu-node-2", *placement())


def test_a_pod_deleted_while_we_bind_is_a_conflict(nodes, backend):
    # A pod on no node is deleted at once, unless a finalizer holds it: then it is "terminating".
    held = user_pod()
    held["metadata"]["finalizers"] = ["example.com/hold"]
    nodes.create_pod(held)
    nodes.begin_deletion("team-vision", "notebook")
    with pytest.raises(PodConflict, match="being deleted"):
        backend.bind_external(PodRef("team-vision", "notebook"), "gpu-node-2", *placement())
    assert not nodes.calls("POST", BINDING)


def test_a_refused_pod_gets_a_warning_event_once_and_stays_pending(nodes, backend):
    nodes.create_pod(user_pod(**{"sharedgpu/gpu_request": "1.5"}))
    why = "sharedgpu/gpu_request: 1.5 is above 1.0"
    backend.reject_external(PodRef("team-vision", "notebook"), why)
    backend.reject_external(PodRef("team-vision", "notebook"), why)
    (event,) = nodes.events()
    pod = nodes.pod("team-vision", "notebook")
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "FailedScheduling", why)
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert "nodeName" not in pod["spec"]
    assert [p.name for p in backend.list_pending_external()] == ["notebook"]
    # A different reason is a new event; a pod that is gone is nothing to report.
    backend.reject_external(PodRef("team-vision", "notebook"), "no GPU of model H100")
    assert len(nodes.events()) == 2
    backend.reject_external(PodRef("team-vision", "nobody"), why)


def test_a_refusal_repeated_every_cycle_is_one_event_whose_count_goes_up(nodes, make_backend, monkeypatch):
    from scheduler.backends.kubernetes import backend as module

    nodes.create_pod(user_pod(**{"sharedgpu/gpu_request": "1.5"}))
    why = "sharedgpu/gpu_request: 1.5 is above 1.0"
    backend = make_backend()
    for _ in range(40):  # cycles in a row: nothing more is sent than the first post
        backend.reject_external(PodRef("team-vision", "notebook"), why)
    assert len(nodes.calls("POST", r"/events$")) == 1 and not nodes.calls("PATCH", r"/events/")
    monkeypatch.setattr(module, "EVENT_REFRESH_S", 0.0)
    backend.reject_external(PodRef("team-vision", "notebook"), why)
    (event,) = nodes.events()
    assert event["count"] == 41
    # Another worker (or a restarted one) counts on the same event instead of posting a second one.
    make_backend().reject_external(PodRef("team-vision", "notebook"), why)
    (event,) = nodes.events()
    assert event["count"] == 42 and len(nodes.calls("POST", r"/events$")) == 2  # its create met 409


def test_kubeshare_manifests_naming_kubeshare_scheduler_are_ours_too(nodes, make_backend, monkeypatch):
    nodes.create_pod(user_pod("kubeshare", scheduler="kubeshare-scheduler"))
    nodes.create_pod(user_pod("mine", scheduler="tessera"))
    nodes.create_pod(user_pod("volcano", scheduler="volcano"))
    assert sorted(p.name for p in make_backend().list_pending_external()) == ["kubeshare", "mine"]
    monkeypatch.setenv("TESSERA_SCHEDULER_NAMES", "tessera, volcano")
    assert sorted(p.name for p in make_backend().list_pending_external()) == ["mine", "volcano"]


def test_a_long_refusal_is_cut_to_what_the_api_server_accepts(nodes, backend):
    nodes.create_pod(user_pod())
    backend.reject_external(PodRef("team-vision", "notebook"), "x" * 5000)
    (event,) = nodes.events()
    assert len(event["message"]) == 1024
