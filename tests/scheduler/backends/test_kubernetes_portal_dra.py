"""The portal's own reservation pods through DRA (`sharing`, portal_claims.py): where the cluster has
our DeviceClass the pod gets a ResourceClaim with the share's compute and memory instead of the
device plugin's slot, the claim is allocated to the placed GPU and reserved for the pod before its
Binding, and deleting the pod takes its claim along; where it has not, nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agents.dra.slices import MIB, SliceApi, SlicePublisher
from agents.gpus.base import GpuDevice
from scheduler.backends import GpuShare, PodRef
from scheduler.backends.kubernetes.manifests import SHARE_RESOURCE

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "dra"
NODE = "gpu-node-1"
GPUS = [GpuDevice(index=i, uuid=f"GPU-0a1b2c3d-0000-4000-8000-00000000000{i + 1}", model="NVIDIA A100-SXM4-40GB",
                  memory_mib=40960, numa_node=0, nvlink_peers=(), mig_mode="disabled") for i in range(2)]
SHARE = (GpuShare(uuid=GPUS[1].uuid, index=1, gpu_request=0.4, gpu_limit=0.4, gpu_memory_mib=12288),)


@pytest.fixture
def dra_cluster(nodes):
    """Our DeviceClasses applied (deploy/dra/deviceclasses.yaml) and the node's slice published."""
    for doc in yaml.safe_load_all((DEPLOY / "deviceclasses.yaml").read_text()):
        if doc:
            nodes.put_object(doc)
    SlicePublisher(SliceApi(host=nodes.url), NODE).sync(GPUS)
    return nodes


def _claims(cluster) -> list[dict]:
    return [c for c in cluster.objects("ResourceClaim") if c["metadata"]["namespace"] == "tessera"]


def test_auto_gives_a_portal_pod_an_allocated_claim_instead_of_the_device_plugin_slot(dra_cluster, backend,
                                                                                       pod_spec):
    status = backend.bind(pod_spec(gpus=SHARE))
    assert status.node == NODE
    pod = dra_cluster.pod("tessera", "tessera-r42-1")
    assert pod["spec"]["nodeName"] == NODE  # bound (by its Binding), not created on the node
    (container,) = pod["spec"]["containers"]
    assert SHARE_RESOURCE not in (container["resources"].get("limits") or {})
    assert container["resources"]["claims"] == [{"name": "gpu"}]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "tessera-r42-1-gpu"}]
    (claim,) = _claims(dra_cluster)
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu-share.tessera.io"
    assert request["exactly"]["capacity"]["requests"] == {"compute": "400", "memory": str(12 * 1024 * MIB)}
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (NODE, "gpu-1")
    assert result["consumedCapacity"] == {"compute": "400", "memory": str(12288 * MIB)}
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "tessera-r42-1",
                                               "uid": pod["metadata"]["uid"]}]
    # The claim was allocated and reserved before the pod had a node: the kubelet never waits for it.
    writes = [(r.method, r.path.rsplit("/", 1)[-1]) for r in dra_cluster.requests if r.method in ("POST", "PUT")]
    # Each write's first time (a read timeout on a busy machine retries one: idempotent, and later).
    first = [w for i, w in enumerate(writes) if w not in writes[:i]]
    assert first[-4:] == [("POST", "pods"), ("POST", "resourceclaims"), ("PUT", "status"), ("POST", "binding")]

    # Released: one delete of the pod; the garbage collector takes its claim (owned by the pod).
    assert backend.unbind(PodRef("tessera", "tessera-r42-1"), grace_s=0, reason="ended")
    assert dra_cluster.pod("tessera", "tessera-r42-1") is None
    assert _claims(dra_cluster) == []


def test_a_retried_bind_finishes_what_an_earlier_one_began(dra_cluster, make_backend, pod_spec):
    # The first try's Binding never arrived (the server failed it): pod and claim exist, allocated.
    dra_cluster.inject("POST", r"/pods/tessera-r42-1/binding$", status=500, times=10)
    with pytest.raises(Exception, match="bind pod"):
        make_backend(retry=dict(attempts=1)).bind(pod_spec(gpus=SHARE))
    assert dra_cluster.faults_left() > 0
    dra_cluster.faults.clear()
    status = make_backend().bind(pod_spec(gpus=SHARE))
    assert status.node == NODE
    (claim,) = _claims(dra_cluster)
    assert len(claim["status"]["reservedFor"]) == 1  # written once
    assert dra_cluster.pod("tessera", "tessera-r42-1")["spec"]["nodeName"] == NODE


def test_auto_keeps_the_device_plugin_where_our_device_class_is_missing(nodes, backend, pod_spec):
    backend.bind(pod_spec(gpus=SHARE))
    (pod,) = nodes.pods()
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {SHARE_RESOURCE: "1"}
    assert "resourceClaims" not in pod["spec"] and _claims(nodes) == []
    # Decided once: the next pod does not ask again.
    asked = len(nodes.calls("GET", r"/deviceclasses/"))
    backend.bind(pod_spec(reservation_id="43", gpus=SHARE))
    assert len(nodes.calls("GET", r"/deviceclasses/")) == asked == 1


def test_auto_keeps_the_device_plugin_on_a_server_without_resource_k8s_io(nodes, backend, pod_spec):
    if not hasattr(nodes, "serves_dra"):
        pytest.skip("a real API server serves what its version serves")
    nodes.serves_dra = False
    backend.bind(pod_spec(gpus=SHARE))
    (pod,) = nodes.pods()
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {SHARE_RESOURCE: "1"}


def test_the_setting_forces_either_path(dra_cluster, make_backend, pod_spec):
    make_backend(sharing="deviceplugin").bind(pod_spec(gpus=SHARE))
    assert _claims(dra_cluster) == []
    make_backend(sharing="dra").bind(pod_spec(reservation_id="43", gpus=SHARE))
    assert [c["metadata"]["name"] for c in _claims(dra_cluster)] == ["tessera-r43-1-gpu"]
    with pytest.raises(ValueError, match="'claims' is not one of auto, deviceplugin, dra"):
        make_backend(sharing="claims")


def test_a_remote_share_keeps_its_own_path(dra_cluster, backend, pod_spec):
    from dataclasses import replace

    spec = pod_spec(gpus=SHARE)
    backend.bind(replace(spec, remote=True, env=(*spec.env, ("TESSERA_REMOTE_SERVER", "gpu-node-2:7070"),
                                                  ("TESSERA_REMOTE_TOKEN", "t"))))
    assert _claims(dra_cluster) == []
    assert dra_cluster.pod("tessera", "tessera-r42-1")["spec"]["nodeName"] == NODE


def test_a_claim_left_by_an_earlier_pod_of_the_same_name_is_waited_for(dra_cluster, backend, pod_spec):
    from scheduler.backends import TransientBackendError

    # The earlier pod is deleted; the garbage collector has not deleted its claim yet.
    dra_cluster.put_object({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "tessera-r42-1-gpu", "namespace": "tessera", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "tessera-r42-1", "uid": "uid-of-the-earlier-pod",
             "controller": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu-share.tessera.io"}}]}}})
    with pytest.raises(TransientBackendError, match="still belongs to an earlier pod"):
        backend.bind(pod_spec(gpus=SHARE))
    assert not dra_cluster.pod("tessera", "tessera-r42-1")["spec"].get("nodeName")  # not bound without it
    backend.claims.resource.delete_namespaced_resource_claim("tessera-r42-1-gpu", "tessera")
    assert backend.bind(pod_spec(gpus=SHARE)).node == NODE  # the retry finishes the same pod
    (claim,) = _claims(dra_cluster)
    assert claim["status"]["reservedFor"][0]["uid"] == dra_cluster.pod("tessera", "tessera-r42-1")["metadata"]["uid"]


def test_the_portal_refuses_to_start_with_an_unknown_sharing_setting(tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(TESSERA_KUBERNETES_SHARING="claims", DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    r = subprocess.run([sys.executable, "manage.py", "check"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "TESSERA_KUBERNETES_SHARING must be 'auto', 'deviceplugin' or 'dra', got 'claims'" in r.stderr
