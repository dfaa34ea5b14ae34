"""The kubectl path with Dynamic Resource Allocation: a pod with `schedulerName: tessera` whose
claims name our classes is admitted by its claims' terms, and binding it writes the claim's
allocation (our device, consumedCapacity on the slice's grid, reservedFor the pod) before the
Binding, in one status write; the node's DRA driver then prepares it with the reservation's terms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agents.dra import dra_pb2
from agents.dra.plugin import DraService, KubernetesClaims
from agents.dra.slices import MIB, SliceApi, SlicePublisher
from agents.gpus.base import GpuDevice
from scheduler.backends import GpuShare, PodConflict, PodRef
from scheduler.backends.base import external_binding
from scheduler.backends.kubernetes.dra import consumed_milli

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "dra" / "examples"
NODE = "gpu-node-1"
GPUS = [GpuDevice(index=i, uuid=f"GPU-00000000-0000-4000-8000-00000000000{i}", model="NVIDIA A100-SXM4-40GB",
                  memory_mib=40960, numa_node=0, nvlink_peers=(), mig_mode="disabled") for i in range(2)]


def example(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


@pytest.fixture
def cluster(nodes, apiserver):
    SlicePublisher(SliceApi(host=apiserver.url), NODE).sync(GPUS)
    return apiserver


def _share_pod(apiserver) -> dict:
    template, pod = example("share.yaml")
    apiserver.put_object(template)
    apiserver.create_pod(pod)
    apiserver.make_template_claims("team-vision", "notebook")  # the resourceclaim controller
    return apiserver.pod("team-vision", "notebook")


def _bind(backend, pod: dict, uuid: str, request: float, memory_mib: int, count: int = 1) -> None:
    gpus = tuple(GpuShare(uuid=u, index=0, gpu_request=request, gpu_limit=request, gpu_memory_mib=memory_mib)
                 for u in [uuid, *(g.uuid for g in GPUS if g.uuid != uuid)][:count])
    labels, annotations = external_binding("41", "vision", gpus, 60)
    backend.bind_external(PodRef("team-vision", pod["metadata"]["name"]), NODE, labels, annotations)


def test_a_pod_asking_a_share_through_its_claim_is_admitted_by_the_claims_terms(cluster, backend):
    template, pod = example("share.yaml")
    cluster.put_object(template)
    cluster.create_pod(pod)
    assert backend.list_pending_external() == []  # its claim is not made from the template yet
    cluster.make_template_claims("team-vision", "notebook")
    (listed,) = backend.list_pending_external()
    assert listed.name == "notebook"
    assert (listed.labels["sharedgpu/gpu_request"], listed.labels["sharedgpu/gpu_mem"]) == ("0.4", "12288Mi")


def test_a_whole_gpu_claim_asks_whole_gpus(cluster, backend):
    claim, pod = example("whole-gpu.yaml")
    cluster.put_object(claim)
    cluster.create_pod(pod)
    (listed,) = backend.list_pending_external()
    assert listed.labels["sharedgpu/gpu_request"] == "1" and "sharedgpu/gpu_mem" not in listed.labels


def test_binding_allocates_the_claim_in_one_status_write_then_labels_and_binds(cluster, backend):
    pod = _share_pod(cluster)
    before = len(cluster.requests)
    _bind(backend, pod, GPUS[1].uuid, 0.4, 12288)
    writes = [(r.method, r.path) for r in cluster.requests[before:] if r.method != "GET"]
    assert set(writes[:2]) == {
        ("PUT", f"/apis/resource.k8s.io/v1/namespaces/team-vision/resourceclaims/"
                f"{pod['status']['resourceClaimStatuses'][0]['resourceClaimName']}/status"),
        # the labels the pod watch selects on (no webhook marks a DRA pod at creation), written meanwhile
        ("PATCH", "/api/v1/namespaces/team-vision/pods/notebook")}
    assert writes[2:] == [("POST", "/api/v1/namespaces/team-vision/pods/notebook/binding")]
    (claim,) = cluster.objects("ResourceClaim")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == ("gpu.tessera.io", NODE, "gpu-1")
    assert result["consumedCapacity"] == {"compute": "400", "memory": str(12288 * MIB)}
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "notebook", "uid": pod["metadata"]["uid"]}]
    assert cluster.pod("team-vision", "notebook")["spec"]["nodeName"] == NODE
    # Again (a retried task): nothing is written twice.
    before = len(cluster.requests)
    _bind(backend, pod, GPUS[1].uuid, 0.4, 12288)
    assert [r for r in cluster.requests[before:] if r.method != "GET"] == []


def test_a_pod_the_webhook_marked_costs_one_claim_status_write_and_the_binding(cluster, backend):
    from scheduler.backends.kubernetes.webhook import share_patch

    cluster.pod_mutators.append(share_patch)  # deploy/portal/webhook.yaml's dra.tessera.io
    pod = _share_pod(cluster)
    assert pod["metadata"]["labels"] == {"tessera.io/reservation": ""}
    before = len(cluster.requests)
    _bind(backend, pod, GPUS[1].uuid, 0.4, 12288)
    writes = [r.method for r in cluster.requests[before:] if r.method != "GET"]
    assert writes == ["PUT", "POST"]


def test_the_node_driver_prepares_the_claim_with_the_reservations_terms(cluster, backend, tmp_path):
    pod = _share_pod(cluster)
    _bind(backend, pod, GPUS[0].uuid, 0.4, 12288)
    (claim,) = cluster.objects("ResourceClaim")
    service = DraService(NODE, GPUS, KubernetesClaims(host=cluster.url), state_dir=tmp_path, cdi_dir=tmp_path)
    uid = claim["metadata"]["uid"]
    answer = service.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(
        namespace="team-vision", name=claim["metadata"]["name"], uid=uid)]), None)
    assert answer.claims[uid].error == ""
    spec = json.loads((tmp_path / f"gpu.tessera.io-share_{uid}.json").read_text())
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert (env["TESSERA_SHARE_ID"], env["TESSERA_GPU_REQUEST"], env["TESSERA_GPU_MEMORY_LIMIT"],
            env["TESSERA_PRIORITY"], env["NVIDIA_VISIBLE_DEVICES"]) == ("41", "0.4", "12288Mi", "high", GPUS[0].uuid)


def test_a_claim_the_kube_scheduler_allocated_first_is_a_conflict(cluster, backend):
    pod = _share_pod(cluster)
    (claim,) = cluster.objects("ResourceClaim")
    claim["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-0",
        "shareID": "6f1c2a40-0000-4000-8000-000000000001",
        "consumedCapacity": {"compute": "400", "memory": str(12288 * MIB)}}]}}}
    cluster.put_object(claim)
    with pytest.raises(PodConflict, match="allocated elsewhere"):
        _bind(backend, pod, GPUS[1].uuid, 0.4, 12288)
    assert not cluster.pod("team-vision", "notebook")["spec"].get("nodeName")


def test_a_placement_that_would_over_commit_the_gpu_is_refused_before_the_binding(cluster, backend):
    # Another claim (the kube-scheduler's) already holds 0.7 of gpu-1: 0.4 more does not fit.
    other = cluster.put_object({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                "metadata": {"name": "theirs", "namespace": "team-vision"},
                                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                    "deviceClassName": "gpu-share.tessera.io"}}]}}})
    other["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": "gpu-1",
        "shareID": "6f1c2a40-0000-4000-8000-000000000002",
        "consumedCapacity": {"compute": "700", "memory": str(MIB)}}]}}}
    cluster.put_object(other)
    pod = _share_pod(cluster)
    with pytest.raises(Exception, match="1100 consumed in all"):
        _bind(backend, pod, GPUS[1].uuid, 0.4, 12288)
    cluster.invalid.clear()
    assert not cluster.pod("team-vision", "notebook")["spec"].get("nodeName")


def test_shares_are_consumed_on_the_slices_grid():
    assert [consumed_milli(s) for s in (0.001, 0.01, 0.25, 0.255, 0.4, 1.0)] == [10, 10, 250, 260, 400, 1000]


def test_the_portal_may_do_exactly_the_dra_calls_it_makes(cluster, backend, make_backend, pod_spec):
    import re

    for doc in yaml.safe_load_all((EXAMPLES.parents[0] / "deviceclasses.yaml").read_text()):
        if doc:
            cluster.put_object(doc)
    pod = _share_pod(cluster)
    before = len(cluster.requests)
    backend.list_pending_external()
    _bind(make_backend(), pod, GPUS[1].uuid, 0.4, 12288)  # another worker: it did not list the claim
    # A portal reservation's pod, with a claim of its own (TESSERA_KUBERNETES_SHARING=auto finds our class).
    share = GpuShare(uuid=GPUS[0].uuid, index=0, gpu_request=0.4, gpu_limit=0.4, gpu_memory_mib=12288)
    backend.bind(pod_spec(node=NODE, namespace="team-vision", gpus=(share,)))
    used: dict[str, set] = {"": set(), "team-vision": set()}
    for r in cluster.requests[before:]:
        m = re.fullmatch(r"/apis/resource\.k8s\.io/v1/(?:namespaces/([^/]+)/)?(\w+)(?:/([^/]+))?(?:/(\w+))?", r.path)
        if m:
            namespace, resource, name, sub = m.groups()
            verb = ("get" if name else "list") if r.method == "GET" else {"PUT": "update", "POST": "create"}[r.method]
            used[namespace or ""].add((f"{resource}/{sub}" if sub else resource, verb))
    docs = [d for d in yaml.safe_load_all((EXAMPLES.parents[1] / "portal" / "rbac.yaml").read_text()) if d]

    def granted(kind: str, name: str) -> set[tuple[str, str]]:
        (role,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
        return {(res, verb) for rule in role["rules"] if rule["apiGroups"] == ["resource.k8s.io"]
                for res in rule["resources"] for verb in rule["verbs"]}

    cluster_wide = granted("ClusterRole", "tessera-scheduler")
    # Cluster-wide only reads; the claim's status write only where a team namespace's RoleBinding grants
    # it, like the pods' writes; claims are made only where portal pods are (the workloads' Role).
    assert used[""] <= cluster_wide and {v for _, v in cluster_wide} == {"get", "list"}
    assert granted("ClusterRole", "tessera-team-namespace") == {("resourceclaims/status", "update")}
    assert granted("Role", "tessera-workloads") == {("resourceclaims", "create")}
    assert used[""] | used["team-vision"] == (cluster_wide | granted("ClusterRole", "tessera-team-namespace")
                                              | granted("Role", "tessera-workloads"))


def test_claims_tessera_cannot_place_are_refused_in_words_and_other_vendors_claims_pass(cluster, backend):
    def claim(name, requests):
        cluster.put_object({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": name, "namespace": "team-vision"},
                            "spec": {"devices": {"requests": requests}}})

    def pod(name, claim_name, labels=None):
        cluster.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "team-vision", "labels": labels or {}},
            "spec": {"schedulerName": "tessera", "resourceClaims": [{"name": "c", "resourceClaimName": claim_name}],
                     "containers": [{"name": "c", "image": "x"}]}})

    share = {"deviceClassName": "gpu-share.tessera.io", "capacity": {"requests": {"compute": "500"}}}
    claim("two", [{"name": "a", "exactly": share}, {"name": "b", "exactly": share}])
    claim("nic", [{"name": "n", "exactly": {"deviceClassName": "nic.example.com"}}])
    pod("greedy", "two")
    pod("labelled", "nic", {"sharedgpu/gpu_request": "0.5"})
    pod("early", "not-made-yet")
    listed = {p.name: p for p in backend.list_pending_external()}
    assert set(listed) == {"labelled"} and listed["labelled"].labels == {"sharedgpu/gpu_request": "0.5"}
    (event,) = cluster.events()
    assert event["involvedObject"]["name"] == "greedy"
    assert "2 requests name a Tessera class; one request (with a count) is supported" in event["message"]


def test_binding_from_the_listing_without_reading_the_pod_still_holds_when_it_moved_on(cluster, backend,
                                                                                      make_backend):
    from scheduler.backends.kubernetes.webhook import share_patch

    cluster.pod_mutators.append(share_patch)
    pod = _share_pod(cluster)
    backend.list_pending_external()
    # Another worker bound it meanwhile (the same placement): ours is then a success, written once.
    _bind(make_backend(), pod, GPUS[1].uuid, 0.4, 12288)
    before = len(cluster.requests)
    _bind(backend, pod, GPUS[1].uuid, 0.4, 12288)
    assert [r.method for r in cluster.requests[before:] if r.method != "GET"] == ["PUT", "POST"]  # both 409
    (claim,) = cluster.objects("ResourceClaim")
    assert len(claim["status"]["reservedFor"]) == 1
    # Listed, then deleted before its binding: the pod is gone, said so.
    _, other = example("share.yaml")
    other["metadata"]["name"] = "notebook-2"
    cluster.create_pod(other)
    cluster.make_template_claims("team-vision", "notebook-2")
    backend.list_pending_external()
    cluster.remove_pod("team-vision", "notebook-2")
    with pytest.raises(PodConflict, match="gone"):
        _bind(backend, {"metadata": {"name": "notebook-2"}}, GPUS[0].uuid, 0.4, 12288)


def test_a_claim_status_write_the_server_fails_is_retried_and_written_once(cluster, backend):
    pod = _share_pod(cluster)
    cluster.inject("PUT", r"/resourceclaims/[^/]+/status$", status=503)
    _bind(backend, pod, GPUS[1].uuid, 0.4, 12288)
    assert len(cluster.calls("PUT", r"/resourceclaims/[^/]+/status$")) == 2  # the 503, then the write
    (claim,) = cluster.objects("ResourceClaim")
    assert len(claim["status"]["reservedFor"]) == 1
    assert cluster.pod("team-vision", "notebook")["spec"]["nodeName"] == NODE


def test_many_kubectl_pods_are_bound_side_by_side_each_with_its_own_outcome(cluster, backend):
    from scheduler.backends import ExternalBinding

    other = [GpuDevice(index=0, uuid="GPU-00000000-0000-4000-8000-0000000000b0", model="NVIDIA A100-SXM4-40GB",
                       memory_mib=40960, numa_node=0, nvlink_peers=(), mig_mode="disabled")]
    SlicePublisher(SliceApi(host=cluster.url), "gpu-node-2").sync(other)
    template, pod = example("share.yaml")
    cluster.put_object(template)
    names = [f"notebook-{i}" for i in range(6)]
    for name in names:
        cluster.create_pod({**pod, "metadata": {**pod["metadata"], "name": name}})
        cluster.make_template_claims("team-vision", name)
    backend.list_pending_external()
    cluster.remove_pod("team-vision", "notebook-3")  # gone before its turn
    cluster.answer_delay_s = 0.05  # a busy server: side by side or not shows
    placed = [(NODE, GPUS[1].uuid)] * 3 + [("gpu-node-2", other[0].uuid)] * 3  # the last three on node 2
    slice_reads = len(cluster.calls("GET", r"/resourceslices/"))
    before = len(cluster.requests)
    backend.bind_concurrency = 2  # fewer in flight than pods on node 1: node 2's pods come later
    outcomes = backend.bind_external_many([
        ExternalBinding(PodRef("team-vision", n), node, *external_binding(str(i), "vision", (GpuShare(
            uuid=uuid, index=0, gpu_request=0.1, gpu_limit=0.1, gpu_memory_mib=1024),), 60))
        for i, (n, (node, uuid)) in enumerate(zip(names, placed, strict=True))])
    assert [type(o).__name__ if o else None for o in outcomes] == [None, None, None, "PodConflict", None, None]
    assert cluster.max_in_flight > 1
    assert len(cluster.calls("GET", r"/resourceslices/")) == slice_reads + 2  # each node's slice read once,
    # both before any pod's claim write: no pod waits on another's read of its node's slice
    order = [r.method for r in cluster.requests[before:] if r.method == "PUT" or "/resourceslices/" in r.path]
    assert order[:2] == ["GET", "GET"] and set(order[2:]) == {"PUT"}
    for name, (node, _) in zip(names, placed, strict=True):
        if name != "notebook-3":
            assert cluster.pod("team-vision", name)["spec"]["nodeName"] == node
    held = [c for c in cluster.objects("ResourceClaim") if c["status"].get("allocation")]
    assert len(held) == 5 and all(len(c["status"]["reservedFor"]) == 1 for c in held)
