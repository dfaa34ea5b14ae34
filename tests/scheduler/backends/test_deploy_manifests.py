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
from agents.deviceplugin.pods import KubernetesPods, NoPodForAllocation, PodFinder
from scheduler.backends import GpuShare, PodRef
from scheduler.backends.base import BROKER_HOST_DIR, PRELOAD_HOST_DIR, BackendError, external_binding

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if "inventory" not in p.parts and p.name != "kustomization.yaml")


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find_kind_namespace(name: str) -> str:
    """The namespace of the workload (DaemonSet, Deployment, StatefulSet, Job) called `name`."""
    return next(d["metadata"]["namespace"] for path in MANIFESTS for d in docs(path)
                if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job") and d["metadata"]["name"] == name)


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


def test_the_kustomization_applies_every_manifest_but_the_optional_ones():
    listed = {DEPLOY / p for p in yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]}
    # deploy/dra/ has its own kustomization (clusters with DRA only): test_dra_manifests.py
    assert listed == {p for p in MANIFESTS if not {"optional", "dra"} & set(p.relative_to(DEPLOY).parts)}


def test_workload_pods_go_to_a_namespace_that_enforces_pod_security_baseline():
    labels = find("Namespace", "tessera-workloads")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    # The node plugins (hostPath, root, host PID) have a privileged namespace of their own; the
    # portal's, with the databases, enforces baseline.
    assert find("Namespace", "tessera-node")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert find("Namespace", "tessera")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    privileged = {d["metadata"]["name"] for path in MANIFESTS for d in docs(path)
                  if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job")
                  and (d["spec"]["template"]["spec"].get("hostPID")
                       or any(v.get("hostPath") for v in d["spec"]["template"]["spec"].get("volumes", ())))}
    assert privileged and all(find_kind_namespace(name) == "tessera-node" for name in privileged)
    assert find("RuntimeClass", "nvidia")["handler"] == "nvidia"


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
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
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

def used_permissions(requests) -> set[tuple[str, str, str | None]]:
    """(resource, verb, namespace) of each request the fake API server saw, as the API server's
    authorizer names them; namespace None for cluster-scoped and all-namespace requests."""
    out = set()
    for r in requests:
        if r.path in ("/readyz", "/livez", "/healthz"):
            continue  # what a busy machine's retries ask; every user may (system:public-info-viewer)
        if r.path.startswith("/apis/resource.k8s.io/"):
            continue  # DRA's grants: test_kubernetes_dra.py checks them against what its paths do
        sub = re.fullmatch(r"/api/v1/(?:namespaces/([^/]+)/)?(\w+)(?:/([^/]+))?(?:/(\w+))?", r.path)
        assert sub, r.path
        namespace, resource, name, subresource = sub.groups()
        resource = f"{resource}/{subresource}" if subresource else resource
        if r.method == "GET":
            verb = "watch" if r.query.get("watch") in ("true", "True", "1") else ("get" if name else "list")
        else:
            verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}[r.method]
        out.add((resource, verb, namespace))
    return out


def rules(kind: str, name: str) -> set[tuple[str, str]]:
    role = find(kind, name)
    return {(res, verb) for rule in role["rules"] if rule["apiGroups"] == [""]
            for res in rule["resources"] for verb in rule["verbs"]}


def check_least_privilege(used, cluster_role: str, roles: tuple[str, ...] = (),
                          bound: dict[str, str] | None = None) -> None:
    """Every call is allowed (a ClusterRole anywhere, a Role in its namespace, a ClusterRole that a
    RoleBinding grants in its namespace: `bound`, namespace → ClusterRole), and every grant is used."""
    cluster = rules("ClusterRole", cluster_role)
    namespaced: dict[str, set] = {}
    for name in roles:
        namespaced.setdefault(find("Role", name)["metadata"]["namespace"], set()).update(rules("Role", name))
    for namespace, role in (bound or {}).items():
        namespaced.setdefault(namespace, set()).update(rules("ClusterRole", role))
    for resource, verb, namespace in used:
        assert (resource, verb) in cluster or (resource, verb) in namespaced.get(namespace, ()), (
            f"{verb} {resource} in {namespace or 'the cluster'} is not granted")
    assert {(res, verb) for res, verb, _ in used} == cluster | {g for grants in namespaced.values() for g in grants}


def test_the_portal_may_do_exactly_what_the_backend_does_and_creates_pods_only_in_its_namespace(
        nodes, make_backend, pod_spec, apiserver, monkeypatch):
    from scheduler.backends.kubernetes import backend as module

    apiserver.add_namespace("tessera-workloads", find("Namespace", "tessera-workloads")["metadata"]["labels"])
    backend = make_backend()
    status = backend.bind(pod_spec(namespace="tessera-workloads"))  # PodSecurity baseline lets it in
    backend.list_pods()
    backend.list_nodes()
    backend.poll(1.0)
    apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": "team-vision"},
                          "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]}})
    backend.list_pending_external()
    monkeypatch.setattr(module, "EVENT_REFRESH_S", 0.0)
    backend.reject_external(PodRef("team-vision", "nb"), "sharedgpu/gpu_request: missing")
    backend.reject_external(PodRef("team-vision", "nb"), "sharedgpu/gpu_request: missing")  # counted
    make_backend().reject_external(PodRef("team-vision", "nb"), "sharedgpu/gpu_request: missing")  # 409: read
    share = GpuShare("GPU-0a1b2c3d-0000-4000-8000-000000000001", 0, 0.5, 0.5, 1024)
    backend.bind_external(PodRef("team-vision", "nb"), "gpu-node-1", *external_binding("9", "vision", (share,), 10))
    apiserver.pod_logs[("tessera-workloads", status.name)] = "epoch 1\nepoch 2\n"
    assert backend.pod_log(status.ref, tail_lines=1).endswith("epoch 2\n")
    with pytest.raises(BackendError):  # the fake speaks no exec, but the terminal's request reaches it
        backend.open_terminal(status.ref, 24, 80)
    backend.unbind(status.ref, grace_s=5, reason="done")
    used = used_permissions(apiserver.requests)
    # An exec WebSocket upgrade is authorized as its GET and, since Kubernetes 1.30
    # (AuthorizePodWebsocketUpgradeCreatePermission), as create too: the fake records the GET only.
    used |= {("pods/exec", "create", namespace) for resource, _, namespace in used if resource == "pods/exec"}
    team_binding = yaml.safe_load((DEPLOY / "optional" / "team-namespace.yaml").read_text())
    assert team_binding["roleRef"]["name"] == "tessera-team-namespace"
    check_least_privilege(used, "tessera-scheduler", roles=("tessera-workloads",),
                          bound={"tessera-workloads": "tessera-team-namespace",
                                 team_binding["metadata"]["namespace"]: "tessera-team-namespace"})
    # cluster-wide it only reads: changing pods is granted per namespace, so kube-system gets none of it
    assert {verb for _, verb in rules("ClusterRole", "tessera-scheduler")} == {"get", "list", "watch"}
    granted_in = {d["metadata"]["namespace"] for d in docs(DEPLOY / "portal" / "rbac.yaml")
                  if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "tessera-team-namespace"}
    assert granted_in == {"tessera-workloads"}
    assert find("ClusterRoleBinding", "tessera-scheduler")["subjects"][0]["name"] == "tessera-portal"
    assert find("RoleBinding", "tessera-workloads")["subjects"][0]["name"] == "tessera-portal"
    assert find("ConfigMap", "tessera-config")["data"]["TESSERA_NAMESPACE"] == "tessera-workloads"


PLUGIN_USER = "system:serviceaccount:tessera-node:tessera-device-plugin"


def plugin_on(apiserver, node: str) -> KubernetesPods:
    """The device plugin of `node`, with a bound ServiceAccount token carrying the node claim."""
    token = f"token-of-{node}"
    apiserver.tokens[token] = (PLUGIN_USER, {"authentication.kubernetes.io/node-name": [node]})
    return KubernetesPods(host=apiserver.url, token=token)


def test_the_device_plugin_may_do_exactly_what_it_does(nodes, backend, apiserver):
    apiserver.add_policy(find("ValidatingAdmissionPolicy", "tessera-device-plugin-own-node"))
    apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": "team-vision"},
                          "spec": {"schedulerName": "tessera", "containers": [
                              {"name": "c", "image": "x", "resources": {"limits": {"tessera.io/gpu-share": "1"}}}]}})
    share = GpuShare("GPU-0a1b2c3d-0000-4000-8000-000000000001", 0, 0.5, 0.5, 1024)
    backend.bind_external(PodRef("team-vision", "nb"), "gpu-node-1", *external_binding("9", "vision", (share,), 10))
    before = len(apiserver.requests)
    claim = PodFinder(plugin_on(apiserver, "gpu-node-1"), "gpu-node-1", "tessera.io/gpu-share").claim(1)
    assert claim.name == "nb"  # the policy let its own node's plugin count the container
    check_least_privilege(used_permissions(apiserver.requests[before:]), "tessera-device-plugin")
    binding = find("ValidatingAdmissionPolicyBinding", "tessera-device-plugin-own-node")
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_a_device_plugin_cannot_touch_another_nodes_pods_or_their_placement(nodes, backend, apiserver):
    apiserver.add_policy(find("ValidatingAdmissionPolicy", "tessera-device-plugin-own-node"))
    apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": "team-vision"},
                          "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]}})
    share = GpuShare("GPU-0a1b2c3d-0000-4000-8000-000000000001", 0, 0.5, 0.5, 1024)
    backend.bind_external(PodRef("team-vision", "nb"), "gpu-node-1", *external_binding("9", "vision", (share,), 10))
    rv = apiserver.pod("team-vision", "nb")["metadata"]["resourceVersion"]
    # Refused at once (an admission policy's 403 does not pass by itself), in the policy's words.
    with pytest.raises(NoPodForAllocation, match=r"HTTP 403 Forbidden: .*only change pods bound to its own node"):
        plugin_on(apiserver, "gpu-node-2").annotate("team-vision", "nb", rv, {"tessera.io/allocated-containers": "1"})
    with pytest.raises(NoPodForAllocation, match=r"HTTP 403 Forbidden: .*only change the tessera.io/allocated-"):
        plugin_on(apiserver, "gpu-node-1").annotate("team-vision", "nb", rv, {"tessera.io/placement": "{}"})
    unclaimed = KubernetesPods(host=apiserver.url, token="no-node-claim")
    apiserver.tokens["no-node-claim"] = (PLUGIN_USER, {})
    with pytest.raises(NoPodForAllocation):
        unclaimed.annotate("team-vision", "nb", rv, {"tessera.io/allocated-containers": "1"})
    assert "tessera.io/allocated-containers" not in apiserver.pod("team-vision", "nb")["metadata"]["annotations"]
    # Everyone else (the portal, users) is not concerned by this policy.
    backend.unbind(PodRef("team-vision", "nb"), grace_s=0, reason="done")


@pytest.mark.parametrize("change", [
    {"spec": {"containers": [{"name": "c", "image": "attacker/miner"}]}},
    {"spec": {"activeDeadlineSeconds": 1}},
    {"spec": {"tolerations": [{"operator": "Exists"}]}},
    {"metadata": {"finalizers": ["example.com/never"]}},
    {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone",
                                       "uid": "00000000-0000-0000-0000-000000000000"}]}},
], ids=["image", "activeDeadlineSeconds", "tolerations", "finalizers", "ownerReferences"])
def test_a_device_plugin_cannot_change_anything_else_of_a_pod_on_its_own_node(change, nodes, backend, apiserver):
    from kubernetes.client.exceptions import ApiException

    apiserver.add_policy(find("ValidatingAdmissionPolicy", "tessera-device-plugin-own-node"))
    apiserver.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nb", "namespace": "team-vision"},
                          "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]}})
    share = GpuShare("GPU-0a1b2c3d-0000-4000-8000-000000000001", 0, 0.5, 0.5, 1024)
    backend.bind_external(PodRef("team-vision", "nb"), "gpu-node-1", *external_binding("9", "vision", (share,), 10))
    before = apiserver.pod("team-vision", "nb")
    plugin = plugin_on(apiserver, "gpu-node-1")
    with pytest.raises(ApiException) as refused:
        plugin.core.patch_namespaced_pod("nb", "team-vision", change)
    assert refused.value.status == 403 and "may not change a pod's spec" in refused.value.body
    assert apiserver.pod("team-vision", "nb") == before


def test_the_ingress_sends_websockets_to_daphne_and_the_rest_to_gunicorn():
    from portal import web_server

    paths = {p["path"]: p["backend"]["service"]["name"]
             for rule in find("Ingress", "tessera")["spec"]["rules"] for p in rule["http"]["paths"]}
    assert paths == {"/ws/": "tessera-live", "/connect/": "tessera-live", "/": "tessera-portal"}
    commands = {}
    for service in paths.values():
        selector = find("Service", service)["spec"]["selector"]
        deployment = find("Deployment", service)
        assert deployment["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {p["name"] for p in container["ports"]} >= {find("Service", service)["spec"]["ports"][0]["targetPort"]}
        commands[service] = container["command"]
    assert commands["tessera-live"][:3] == ["python", "-m", "portal.serve"]  # the WebSocket frame limit
    assert commands["tessera-portal"][:3] == ["gunicorn", "-c", "python:portal.web_server"]
    assert web_server.wsgi_app == "portal.wsgi:application" and web_server.limit_request_line > 0


def test_app_ports_admit_only_the_portals_proxy():
    """The pods with an app (the Kubernetes backend labels them and names their port) admit the live
    pods (Daphne, where /connect/ is proxied) on that port, and nothing else at all."""
    from scheduler.backends.kubernetes.manifests import APP_LABEL, APP_PORT_NAME

    policy = find("NetworkPolicy", "tessera-connect-apps")
    assert policy["metadata"]["namespace"] == find("ConfigMap", "tessera-config")["data"]["TESSERA_NAMESPACE"]
    assert policy["spec"]["podSelector"] == {"matchExpressions": [{"key": APP_LABEL, "operator": "Exists"}]}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": APP_PORT_NAME, "protocol": "TCP"}]
    (source,) = rule["from"]
    live = find("Deployment", "tessera-live")
    assert live["spec"]["template"]["metadata"]["labels"].items() >= source["podSelector"]["matchLabels"].items()
    assert source["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": live["metadata"]["namespace"]}


def test_the_portal_trusts_exactly_the_ingress_as_proxy_and_its_probe_names_an_allowed_host():
    config = find("ConfigMap", "tessera-config")["data"]
    assert config["TESSERA_TRUSTED_PROXIES"] == "1"
    hosts = {h for rule in find("Ingress", "tessera")["spec"]["rules"] for h in [rule["host"]]}
    assert hosts <= set(config["ALLOWED_HOSTS"].split(","))
    probe = find("Deployment", "tessera-portal")["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert {h["name"]: h["value"] for h in probe["httpGet"]["httpHeaders"]}["Host"] in hosts
