"""The Kubernetes manifests in deploy/ are valid for a current Kubernetes, complete, and grant the
portal and the device plugin exactly the API calls their code makes (checked by running the code
against the fake API server and reading what it asked for)."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from agents.deviceplugin.__main__ import build_parser as plugin_parser
from agents.deviceplugin.pods import KubernetesPods, PodFinder
from scheduler.backends import GpuShare, PodRef
from scheduler.backends.base import BROKER_HOST_DIR, PRELOAD_HOST_DIR, external_binding

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if "inventory" not in p.parts and p.name != "kustomization.yaml")


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find(kind: str, name: str) -> dict:
    for path in MANIFESTS:
        for d in docs(path):
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no {kind} {name} in deploy/")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_is_valid_for_kubernetes_1_34(path):
    for d in docs(path):
        kubernetes_validate.validate(d, "1.34.0", strict=True)


def test_the_kustomization_applies_every_manifest():
    listed = {DEPLOY / p for p in yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]}
    assert listed == set(MANIFESTS)


def test_there_is_one_beat_and_it_is_never_doubled_during_an_update():
    beat = find("Deployment", "tessera-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"


def test_portal_workers_and_migrations_share_one_configuration_on_the_kubernetes_backend():
    config = find("ConfigMap", "tessera-config")["data"]
    assert config["TESSERA_BACKEND"] == "kubernetes" and config["TESSERA_PROFILE"] == "production"
    assert config["REDIS_URL"].startswith("redis://tessera-redis:")
    for kind, name in [("Deployment", "tessera-portal"), ("Deployment", "tessera-worker"),
                       ("Deployment", "tessera-beat"), ("Job", "tessera-migrate")]:
        (container,) = find(kind, name)["spec"]["template"]["spec"]["containers"]
        refs = {next(iter(r.values()))["name"] for r in container["envFrom"]}
        assert refs == {"tessera-config", "tessera-secrets"}, name
    for name in ("tessera-portal", "tessera-worker"):
        assert find("Deployment", name)["spec"]["template"]["spec"]["serviceAccountName"] == "tessera-portal"


def test_the_node_plugins_mount_what_workload_pods_expect_and_run_the_plugin_with_flags_it_accepts():
    spec = find("DaemonSet", "tessera-node")["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert host_paths["preload"] == PRELOAD_HOST_DIR and host_paths["broker"] == BROKER_HOST_DIR
    containers = {c["name"]: c for c in spec["containers"]}
    args = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in containers["device-plugin"]["args"]]
    parsed = plugin_parser().parse_args(args)
    assert parsed.node == "gpu-node-1" and parsed.preload_dir == PRELOAD_HOST_DIR
    assert parsed.broker_dir == BROKER_HOST_DIR
    mounts = {m["mountPath"] for m in containers["device-plugin"]["volumeMounts"]}
    assert str(parsed.plugin_dir) in mounts
    assert f"{BROKER_HOST_DIR}/broker.sock" in containers["broker"]["command"]


# -- RBAC: granted == used ---------------------------------------------------------------------------

def used_permissions(requests) -> set[tuple[str, str]]:
    """(resource, verb) of each request the fake API server saw, as the API server's authorizer names them."""
    out = set()
    for r in requests:
        path = r.path
        sub = re.fullmatch(r"/api/v1/(?:namespaces/[^/]+/)?(\w+)(?:/([^/]+))?(?:/(\w+))?", path)
        assert sub, path
        resource, name, subresource = sub.groups()
        resource = f"{resource}/{subresource}" if subresource else resource
        if r.method == "GET":
            verb = "watch" if r.query.get("watch") in ("true", "True", "1") else ("get" if name else "list")
        else:
            verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}[r.method]
        out.add((resource, verb))
    return out


def granted(role_name: str) -> set[tuple[str, str]]:
    role = find("ClusterRole", role_name)
    return {(res, verb) for rule in role["rules"] if rule["apiGroups"] == [""]
            for res in rule["resources"] for verb in rule["verbs"]}


def test_the_portal_may_do_exactly_what_the_backend_does(nodes, backend, pod_spec, apiserver):
    status = backend.bind(pod_spec())
    backend.list_pods()
    backend.list_nodes()
    backend.poll(1.0)
    apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": "team-vision"},
                          "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]}})
    backend.list_pending_external()
    backend.reject_external(PodRef("team-vision", "nb"), "sharedgpu/gpu_request: missing")
    share = GpuShare("GPU-0a1b2c3d-0000-4000-8000-000000000001", 0, 0.5, 0.5, 1024)
    backend.bind_external(PodRef("team-vision", "nb"), "gpu-node-1", *external_binding("9", "vision", (share,), 10))
    backend.unbind(status.ref, grace_s=5, reason="done")
    assert used_permissions(apiserver.requests) == granted("tessera-scheduler")
    binding = find("ClusterRoleBinding", "tessera-scheduler")
    assert binding["subjects"][0]["name"] == "tessera-portal"


def test_the_device_plugin_may_do_exactly_what_it_does(nodes, backend, apiserver):
    apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": "team-vision"},
                          "spec": {"schedulerName": "tessera", "containers": [
                              {"name": "c", "image": "x", "resources": {"limits": {"tessera.io/gpu-share": "1"}}}]}})
    share = GpuShare("GPU-0a1b2c3d-0000-4000-8000-000000000001", 0, 0.5, 0.5, 1024)
    backend.bind_external(PodRef("team-vision", "nb"), "gpu-node-1", *external_binding("9", "vision", (share,), 10))
    before = len(apiserver.requests)
    PodFinder(KubernetesPods(host=apiserver.url), "gpu-node-1", "tessera.io/gpu-share").claim(1)
    assert used_permissions(apiserver.requests[before:]) == granted("tessera-device-plugin")
