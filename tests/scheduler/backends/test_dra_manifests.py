"""deploy/dra/: the DRA driver's own kustomization, its DaemonSet runs the driver with flags it
accepts and mounts where the kubelet and the runtime look, its RBAC grants exactly the calls the
driver makes, its admission policy keeps each node's driver to its own node's slice, and the
example claims are what the API server and the driver take."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agents.dra import dra_pb2
from agents.dra.__main__ import build_parser
from agents.dra.plugin import DraService, KubernetesClaims
from agents.dra.slices import MIB, SliceApi, SlicePublisher
from agents.gpus.base import GpuDevice
from tests.scheduler.backends.fake_apiserver import K8S_VERSION

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
DRA = DEPLOY / "dra"
USER = "system:serviceaccount:tessera-node:tessera-dra"
GPUS = [GpuDevice(index=i, uuid=f"GPU-00000000-0000-4000-8000-00000000000{i}", model="NVIDIA A100-SXM4-40GB",
                  memory_mib=40960, numa_node=0, nvlink_peers=(), mig_mode="disabled") for i in range(2)]


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find(kind: str, name: str) -> dict:
    for path in sorted(DRA.rglob("*.yaml")):
        for d in docs(path):
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no {kind} {name} in deploy/dra/")


def driver_on(apiserver, node: str) -> tuple[SliceApi, KubernetesClaims]:
    """The driver of `node`, with a bound ServiceAccount token carrying the node claim."""
    token = f"dra-token-of-{node}"
    apiserver.tokens[token] = (USER, {"authentication.kubernetes.io/node-name": [node]})
    return SliceApi(host=apiserver.url, token=token), KubernetesClaims(host=apiserver.url, token=token)


def used(requests) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of each request, as the authorizer names them."""
    out = set()
    for r in requests:
        m = re.fullmatch(r"/(?:api/v1|apis/([\w.]+)/v1)/(?:namespaces/[^/]+/)?(\w+)(?:/([^/]+))?(?:/(\w+))?", r.path)
        assert m, r.path
        group, resource, name, sub = m.groups()
        verb = ("get" if name else "list") if r.method == "GET" else {
            "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[r.method]
        out.add((group or "", f"{resource}/{sub}" if sub else resource, verb))
    return out


def granted() -> set[tuple[str, str, str]]:
    role = find("ClusterRole", "tessera-dra")
    return {(group, res, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for res in rule["resources"] for verb in rule["verbs"]}


def test_the_dra_kustomization_applies_everything_but_the_examples():
    listed = {DRA / p for p in yaml.safe_load((DRA / "kustomization.yaml").read_text())["resources"]}
    assert listed == {p for p in DRA.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert sorted(p.name for p in (DRA / "examples").glob("*.yaml")) == ["gang.yaml", "share.yaml", "whole-gpu.yaml"]


def test_the_daemonset_runs_the_driver_with_flags_it_accepts_where_the_kubelet_looks():
    pod = find("DaemonSet", "tessera-dra")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args([a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["args"]])
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: host[m["name"]] for m in container["volumeMounts"]}
    for path in (args.plugins_dir, args.registry_dir, args.cdi_dir):
        assert mounts[str(path)] == str(path)  # the same path on the host as in the container
    assert str(args.registry_dir) == "/var/lib/kubelet/plugins_registry"
    assert pod["serviceAccountName"] == "tessera-dra"


def test_the_driver_may_do_exactly_what_it_does(nodes, apiserver, tmp_path):
    apiserver.add_policy(find("ValidatingAdmissionPolicy", "tessera-dra-own-node"))
    slices, claims = driver_on(apiserver, "gpu-node-1")
    publisher = SlicePublisher(slices, "gpu-node-1")
    publisher.sync(GPUS)
    publisher.sync(GPUS[:1])
    claim = apiserver.put_object(docs(DRA / "examples" / "whole-gpu.yaml")[0])
    pod = apiserver.create_pod(docs(DRA / "examples" / "whole-gpu.yaml")[1])
    claim["status"] = {"reservedFor": [{"resource": "pods", "name": "trainer", "uid": pod["metadata"]["uid"]}],
                       "allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.tessera.io", "pool": "gpu-node-1", "device": "gpu-0",
        "shareID": "6f1c2a40-0000-4000-8000-000000000001",
        "consumedCapacity": {"compute": "1000", "memory": str(40960 * MIB)}}]}}}
    apiserver.put_object(claim)
    service = DraService("gpu-node-1", GPUS, claims, state_dir=tmp_path / "state", cdi_dir=tmp_path / "cdi")
    request = dra_pb2.NodePrepareResourcesRequest(claims=[
        dra_pb2.Claim(namespace="team-vision", name="whole-gpu", uid=claim["metadata"]["uid"])])
    assert service.NodePrepareResources(request, None).claims[claim["metadata"]["uid"]].error == ""
    publisher.withdraw()
    mine = [r for r in apiserver.requests if r.user[0] == USER]
    assert used(mine) == granted()
    assert find("ValidatingAdmissionPolicyBinding", "tessera-dra-own-node")["spec"]["validationActions"] == ["Deny"]


def test_a_driver_cannot_publish_change_or_withdraw_another_nodes_slice(nodes, apiserver):
    apiserver.add_policy(find("ValidatingAdmissionPolicy", "tessera-dra-own-node"))
    SlicePublisher(driver_on(apiserver, "gpu-node-1")[0], "gpu-node-1").sync(GPUS)
    intruder = SlicePublisher(driver_on(apiserver, "gpu-node-2")[0], "gpu-node-1")
    for act in (lambda: intruder.sync(GPUS[:1]), intruder.withdraw):
        with pytest.raises(ApiException) as info:
            act()
        assert info.value.status == 403
        assert b"only write the ResourceSlice of its own node; this one is of gpu-node-1" in info.value.body
    with pytest.raises(ApiException):
        SlicePublisher(driver_on(apiserver, "gpu-node-2")[0], "gpu-node-1").api.create_slice(
            {**apiserver.objects("ResourceSlice")[0], "metadata": {"name": "forged"}})
    (stored,) = apiserver.objects("ResourceSlice")
    assert len(stored["spec"]["devices"]) == 2
    # The node's own driver still may; a token without the node claim may not.
    SlicePublisher(driver_on(apiserver, "gpu-node-1")[0], "gpu-node-1").sync(GPUS[:1])
    apiserver.tokens["no-claim"] = (USER, {})
    with pytest.raises(ApiException):
        SlicePublisher(SliceApi(host=apiserver.url, token="no-claim"), "gpu-node-1").withdraw()
    apiserver.invalid.clear()


def test_the_device_classes_and_example_claims_are_taken_by_the_api_server(nodes, apiserver):
    for d in docs(DRA / "deviceclasses.yaml"):
        apiserver.put_object(d)
    for name in ("share.yaml", "gang.yaml", "whole-gpu.yaml"):
        for d in docs(DRA / "examples" / name):
            if d["apiVersion"] == "resource.k8s.io/v1":
                apiserver.put_object(d)
            else:  # the pods that use them: checked against the API's schema, not run
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    template = [t for t in apiserver.objects("ResourceClaimTemplate") if t["metadata"]["name"] == "gpu-share-04-12gi"]
    requests = template[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]
    assert requests == {"compute": "400", "memory": "12Gi"}
    assert {c["metadata"]["name"] for c in apiserver.objects("DeviceClass")} == {
        "gpu-share.tessera.io", "gpu-whole.tessera.io"}
