"""The fake API server's test-facing surface over a real kube-apiserver, so that the backend's tests
can be run against one and show where the fake and the real server differ.

    TESSERA_TEST_KUBE_API=https://127.0.0.1:6443 TESSERA_TEST_KUBE_TOKEN=<a cluster-admin token> \\
    TESSERA_TEST_KUBE_AUDIT_LOG=/path/to/audit.log pytest tests/scheduler/backends

What the server must be: any kube-apiserver (no kubelets, scheduler or controllers needed) that
lets anonymous requests act as cluster-admin (the backend under test sends no credentials, as
against the fake) and writes an audit log (JSON, level Request for pods and their subresources, so
that `calls()` sees their bodies). The tests' own "outside" actions (the kubelet's phase changes,
a user's kubectl pod, a controller's ServiceAccount) go in with the admin token and are left out of
`requests`, as the fake keeps them out.

The kubelet is played as far as the tests need it: a deleted pod that is bound to a node is
finished (deleted with grace 0) unless `hold_deletions` is set, since without a kubelet it would
stay terminating forever; the resourceclaim controller's and the garbage collector's parts for
claims are played too (`make_template_claims`; a deleted pod's claims go). Anything else the fake
offers (faults, pausing watches, tokens, pod logs, mutating webhooks, a server without
resource.k8s.io) has no real counterpart here: a test that reaches for it is skipped.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

TEST_NAMESPACES = ("default", "tessera", "team-vision")
_BEARER = re.compile(rb"((?i:authorization): Bearer )([^\r\n]+)\r\n")
HOLDER_LABEL = "tessera-tests/token-holder"  # pods that only hold a bound token: not the tests' pods
DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
_VERB_METHOD = {"create": "POST", "get": "GET", "list": "GET", "watch": "GET", "update": "PUT", "patch": "PATCH",
                "delete": "DELETE", "deletecollection": "DELETE"}


class _Relay:
    """Plain HTTP on 127.0.0.1 relayed byte for byte to the API server over TLS: the backend under
    test is built from a bare URL (as against the fake), and keep-alive and watch streams pass as
    they are."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.target = (parts.hostname, parts.port or 443)
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE  # a test cluster's self-signed certificate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.stopping = False
        # Bearer tokens a test names (the fake's `tokens`) → the real ones they stand for. urllib3
        # sends a request's headers in one write, so a header never straddles two reads.
        self.tokens: dict[bytes, bytes] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = self.context.wrap_socket(socket.create_connection(self.target), server_hostname=self.target[0])
            for a, b, out in ((near, far, True), (far, near, False)):
                threading.Thread(target=self._pump, args=(a, b, out), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, outgoing: bool) -> None:
        try:
            while data := src.recv(65536):
                if outgoing and self.tokens:
                    data = _BEARER.sub(lambda m: m[1] + self.tokens.get(m[2], m[2]) + b"\r\n", data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


class _Tokens:
    """`tokens[name] = (user, extra)` makes a real ServiceAccount token for `user`
    (system:serviceaccount:NS:NAME), with the node-name claim when `extra` names a node (a token
    bound to a pod on that node, as the kubelet gives a pod), and the ServiceAccount's RBAC as
    deploy/ grants it; requests that carry `name` go in with it."""

    NODE_CLAIM = "authentication.kubernetes.io/node-name"

    def __init__(self, server: RealApiServer) -> None:
        self.server = server

    def __setitem__(self, name: str, identity: tuple[str, dict[str, list[str]]]) -> None:
        user, extra = identity
        _, _, namespace, account = user.split(":")
        server = self.server
        if namespace not in server.namespaces:
            server.add_namespace(namespace)
        server.add_service_account(namespace, account)
        server._grant(namespace, account)
        request: dict[str, Any] = {"spec": {"audiences": [], "expirationSeconds": 3600}}
        nodes = extra.get(self.NODE_CLAIM) or []
        if nodes:
            holder = f"token-holder-{nodes[0]}"
            server._ignore_404(server.core.delete_namespaced_pod, holder, namespace, grace_period_seconds=0)
            server.core.create_namespaced_pod(namespace, {
                "metadata": {"name": holder, "labels": {HOLDER_LABEL: "true"}},
                "spec": {"serviceAccountName": account, "nodeName": nodes[0],
                         "containers": [{"name": "c", "image": "x"}]}})
            uid = server.core.read_namespaced_pod(holder, namespace).metadata.uid
            request["spec"]["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": holder, "uid": uid}
        answer = server.core.create_namespaced_service_account_token(account, namespace, request)
        server._relay.tokens[name.encode()] = answer.status.token.encode()


@dataclass
class _Set:
    """A set-like view whose add/discard/clear act on the cluster (ServiceAccounts, RuntimeClasses)."""

    add: Any
    discard: Any
    members: Any
    clear: Any = None

    def __contains__(self, item: object) -> bool:
        return item in self.members()


class ApiError(Exception):
    """A refusal, in the API server's own words (its Status message), with its HTTP code."""

    def __init__(self, exc: ApiException) -> None:
        try:
            message = json.loads(exc.body)["message"]
        except (TypeError, ValueError, KeyError):
            message = str(exc)
        super().__init__(message)
        self.code = exc.status


class RealApiServer:
    def __init__(self, upstream: str, token: str, audit_log: str, request_type: type) -> None:
        """`request_type`: the fake's Request, which `requests` and `calls()` answer with."""
        self.upstream, self.token, self.audit_log = upstream, token, audit_log
        self._request_type = request_type
        self.namespaces = set(TEST_NAMESPACES)
        self.invalid: list = []  # the real server refuses invalid objects itself
        self.hold_deletions = False
        config = client.Configuration()
        config.host = self.upstream
        config.verify_ssl = False
        config.api_key = {"authorization": f"Bearer {self.token}"}
        self.api = client.ApiClient(config)
        self.api.user_agent = "tessera-tests-outside"
        self.core = client.CoreV1Api(self.api)
        self.node_api = client.NodeV1Api(self.api)
        self.admission = client.AdmissionregistrationV1Api(self.api)
        self._relay = _Relay(self.upstream)
        self._audit_offset = 0
        self._requests: list = []
        self._stop = threading.Event()

    @property
    def service_accounts(self) -> _Set:
        return _Set(add=lambda key: self.add_service_account(*key),
                    discard=lambda key: self._delete_service_account(*key), members=self._service_accounts)

    @property
    def runtime_classes(self) -> _Set:
        return _Set(add=self._add_runtime_class,
                    discard=lambda name: self._ignore_404(self.node_api.delete_runtime_class, name),
                    members=self._runtime_class_names, clear=self._clear_runtime_classes)

    @property
    def tokens(self) -> _Tokens:
        return _Tokens(self)

    @runtime_classes.setter
    def runtime_classes(self, names: set[str]) -> None:
        self._clear_runtime_classes()
        for name in names:
            self._add_runtime_class(name)

    # -- life -------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._relay.url

    def start(self) -> RealApiServer:
        self._reset()
        with open(self.audit_log, "rb") as f:
            self._audit_offset = f.seek(0, 2)
        threading.Thread(target=self._kubelet, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._relay.stop()
        self._reset()
        self.api.close()

    def _reset(self) -> None:
        """Every test starts from the fake's initial state: its namespaces with a default
        ServiceAccount, the nvidia RuntimeClass, no pods, nodes, events or policies of ours."""
        for ns in self.core.list_namespace().items:
            if ns.metadata.name not in TEST_NAMESPACES and ns.metadata.name.startswith(("tessera", "team-")):
                self._delete_pods(ns.metadata.name)
        for name in TEST_NAMESPACES:
            self.add_namespace(name)
            self._delete_pods(name)
            self.core.delete_collection_namespaced_event(name)
        for node in self.core.list_node().items:
            self.core.delete_node(node.metadata.name)
        for binding in self.admission.list_validating_admission_policy_binding().items:
            self.admission.delete_validating_admission_policy_binding(binding.metadata.name)
        for policy in self.admission.list_validating_admission_policy().items:
            self.admission.delete_validating_admission_policy(policy.metadata.name)
        self._add_runtime_class("nvidia")
        for plural in ("resourceclaims", "resourceclaimtemplates"):
            for name in TEST_NAMESPACES:
                self._ignore_404(self.api.call_api, f"/apis/resource.k8s.io/v1/namespaces/{name}/{plural}", "DELETE",
                                 auth_settings=["BearerToken"], _preload_content=False)
        for plural in ("resourceslices", "deviceclasses"):
            self._ignore_404(self.api.call_api, f"/apis/resource.k8s.io/v1/{plural}", "DELETE",
                             auth_settings=["BearerToken"], _preload_content=False)

    def _delete_pods(self, namespace: str) -> None:
        for pod in self.core.list_namespaced_pod(namespace).items:
            if pod.metadata.finalizers:
                self._ignore_404(self.core.patch_namespaced_pod, pod.metadata.name, namespace,
                                 {"metadata": {"finalizers": None}})
            self._ignore_404(self.core.delete_namespaced_pod, pod.metadata.name, namespace, grace_period_seconds=0)

    def _kubelet(self) -> None:
        """Finish the deletion of terminating pods, as a kubelet does once the containers stop."""
        while not self._stop.wait(0.2):
            if self.hold_deletions:
                continue
            with contextlib.suppress(Exception):
                for pod in self.core.list_pod_for_all_namespaces().items:
                    if pod.metadata.deletion_timestamp is not None:
                        self._ignore_404(self.core.delete_namespaced_pod, pod.metadata.name,
                                         pod.metadata.namespace, grace_period_seconds=0)
                self._collect_claims()

    def __getattr__(self, name: str) -> Any:
        # What only the fake can do (faults, tokens, pod logs, webhooks, watch control).
        pytest.skip(f"needs the fake API server ({name})")

    # -- what tests do from "outside" -------------------------------------------------------------

    def add_node(self, name: str, ready: bool = True, address: str | None = None) -> dict:
        self._ignore_404(self.core.delete_node, name)
        self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}}})
        if address:
            self.core.patch_node_status(name, {"status": {"addresses": [
                {"type": "Hostname", "address": name}, {"type": "InternalIP", "address": address}]}})
        return self.set_node_ready(name, ready)

    def remove_node(self, name: str) -> None:
        """Delete the node and what its ownerReferences hold, as the garbage collector would (this
        server runs no kube-controller-manager)."""
        uid = self.core.read_node(name).metadata.uid
        self.core.delete_node(name)
        for obj in self.objects("ResourceSlice"):
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ()):
                path = f"/apis/resource.k8s.io/v1/resourceslices/{obj['metadata']['name']}"
                self._ignore_404(self.api.call_api, path, "DELETE", auth_settings=["BearerToken"],
                                 _preload_content=False)

    def objects(self, kind: str) -> list[dict]:
        plural = {"Node": "/api/v1/nodes", "ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices",
                  "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
                  "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
                  "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/resourceclaimtemplates"}[kind]
        return (self._raw(plural) or {}).get("items") or []

    def put_object(self, obj: dict) -> dict:
        """Create or replace an object as a user's kubectl would (resource.k8s.io/v1 kinds); a claim's
        `status`, where given, is written through its status subresource (as the kube-scheduler
        writes an allocation), as the fake stores it."""
        meta = obj["metadata"]
        plural = obj["kind"].lower() + ("es" if obj["kind"].endswith("s") else "s")
        where = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
        path = f"/apis/resource.k8s.io/v1{where}/{plural}"
        body = {k: v for k, v in obj.items() if k != "status"}
        try:
            stored = self._send("POST", path, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = self._raw(f"{path}/{meta['name']}")
            body["metadata"] = {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
            stored = self._send("PUT", f"{path}/{meta['name']}", body)
        if obj["kind"] == "ResourceClaim" and obj.get("status"):
            stored = self._send("PUT", f"{path}/{meta['name']}/status", {**stored, "status": obj["status"]})
        return stored

    def make_template_claims(self, namespace: str, pod_name: str) -> list[dict]:
        """What the resourceclaim controller (not running here) does for a new pod: a claim from each
        ResourceClaimTemplate it names, owned by the pod, recorded in its status.resourceClaimStatuses."""
        pod = self.pod(namespace, pod_name)
        made, statuses = [], []
        for ref in pod["spec"].get("resourceClaims") or ():
            if not ref.get("resourceClaimTemplateName"):
                continue
            template = self._raw(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/"
                                 f"{ref['resourceClaimTemplateName']}")
            claim = self.put_object({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {**(template["spec"].get("metadata") or {}),
                             "name": f"{pod_name}-{ref['name']}-{uuid.uuid4().hex[:5]}", "namespace": namespace,
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                                  "uid": pod["metadata"]["uid"], "controller": True}]},
                "spec": template["spec"]["spec"]})
            made.append(claim)
            statuses.append({"name": ref["name"], "resourceClaimName": claim["metadata"]["name"]})
        self.core.patch_namespaced_pod_status(pod_name, namespace, {"status": {"resourceClaimStatuses": statuses}})
        return made

    def _collect_claims(self) -> None:
        """What the garbage collector (not running here) does: claims whose owning pod is gone go too."""
        pods = {p.metadata.uid for p in self.core.list_pod_for_all_namespaces().items}
        for claim in self.objects("ResourceClaim"):
            owners = [r for r in claim["metadata"].get("ownerReferences") or () if r.get("kind") == "Pod"]
            if owners and not any(r.get("uid") in pods for r in owners):
                path = (f"/apis/resource.k8s.io/v1/namespaces/{claim['metadata']['namespace']}/resourceclaims/"
                        f"{claim['metadata']['name']}")
                self._ignore_404(self.api.call_api, path, "DELETE", auth_settings=["BearerToken"],
                                 _preload_content=False)

    def _send(self, method: str, path: str, body: dict) -> dict:
        answer = self.api.call_api(path, method, body=body, auth_settings=["BearerToken"],
                                   _preload_content=False)[0]
        return json.loads(answer.data)

    def set_node_ready(self, name: str, ready: bool) -> dict:
        condition = {"type": "Ready", "status": "True" if ready else "False",
                     "reason": "KubeletReady" if ready else "NodeStatusUnknown"}
        self.core.patch_node_status(name, {"status": {"conditions": [condition]}})
        return self._raw(f"/api/v1/nodes/{name}")

    def add_namespace(self, name: str, labels: dict[str, str] | None = None, *,
                      service_account: bool = True) -> None:
        wanted = {"kubernetes.io/metadata.name": name, **(labels or {})}
        try:
            current = self.core.read_namespace(name).metadata.labels or {}
            patch = {k: None for k in current if k not in wanted} | wanted
            self.core.patch_namespace(name, {"metadata": {"labels": patch}})
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.core.create_namespace({"metadata": {"name": name, "labels": wanted}})
        self.namespaces.add(name)
        if service_account:
            self.add_service_account(name)
        else:
            self._delete_service_account(name, "default")

    def add_policy(self, policy: dict) -> None:
        self.admission.create_validating_admission_policy(policy)
        name = policy["metadata"]["name"]
        self.admission.create_validating_admission_policy_binding({
            "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}})

    def add_service_account(self, namespace: str, name: str = "default") -> None:
        try:
            self.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def create_pod(self, manifest: dict) -> dict:
        try:
            self.core.create_namespaced_pod(manifest["metadata"]["namespace"], manifest)
        except ApiException as exc:
            raise ApiError(exc) from exc
        return self.pod(manifest["metadata"]["namespace"], manifest["metadata"]["name"])

    def set_pod_phase(self, namespace: str, name: str, phase: str, reason: str = "",
                      container_reason: str = "") -> None:
        status: dict[str, Any] = {"phase": phase}
        if reason:
            status["reason"] = reason
        if container_reason:
            status["containerStatuses"] = [{
                "name": "main", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"reason": container_reason, "exitCode": 1}}}]
        self.core.patch_namespaced_pod_status(name, namespace, {"status": status})

    def remove_pod(self, namespace: str, name: str) -> None:
        self._ignore_404(self.core.patch_namespaced_pod, name, namespace, {"metadata": {"finalizers": None}})
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def begin_deletion(self, namespace: str, name: str) -> None:
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=30)

    def finish_deletion(self, namespace: str, name: str) -> None:
        self.remove_pod(namespace, name)

    def pod(self, namespace: str, name: str) -> dict | None:
        return self._raw(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def pods(self) -> list[dict]:
        return [p for ns in self.namespaces for p in self._raw(f"/api/v1/namespaces/{ns}/pods")["items"]
                if HOLDER_LABEL not in (p["metadata"].get("labels") or {})]

    def events(self) -> list[dict]:
        return [e for ns in self.namespaces for e in self._raw(f"/api/v1/namespaces/{ns}/events")["items"]]

    # -- what the backend asked --------------------------------------------------------------------

    @property
    def requests(self) -> list:
        self._read_audit()
        return list(self._requests)

    @property
    def validated(self) -> int:
        """Pods the server took from the backend: it validates every object it accepts."""
        return sum(1 for r in self.calls("POST", r"/pods$") if 200 <= r.code < 300)

    def calls(self, method: str, path: str) -> list:
        pattern = re.compile(path)
        return [r for r in self.requests if r.method == method and pattern.search(r.path)]

    def _read_audit(self) -> None:
        """The audit log's new lines (those of the tests' admin left out); waits until it has been
        quiet for 0.3 s, since an answer is sent before its audit event is written."""
        deadline, quiet_since = time.monotonic() + 3.0, time.monotonic()
        while time.monotonic() < deadline:
            with open(self.audit_log, "rb") as f:
                f.seek(self._audit_offset)
                data = f.read()
            complete = data[:data.rfind(b"\n") + 1]
            self._audit_offset += len(complete)
            if complete:
                quiet_since = time.monotonic()
            for line in complete.splitlines():
                event = json.loads(line)
                user = event.get("user") or {}
                if (event.get("stage") != "ResponseComplete" or event.get("userAgent") == self.api.user_agent
                        or user.get("username") in (None, "system:apiserver")):
                    continue  # the tests' own outside actions, the server's own loopback calls
                uri = urlsplit(event["requestURI"])
                self._requests.append(self._request_type(
                    _VERB_METHOD.get(event["verb"], event["verb"].upper()), uri.path,
                    {k: v[-1] for k, v in parse_qs(uri.query, keep_blank_values=True).items()},
                    event.get("requestObject"), "", (user["username"], user.get("extra", {})),
                    (event.get("responseStatus") or {}).get("code", 0)))
            if time.monotonic() - quiet_since >= 0.3:
                return
            time.sleep(0.05)

    # -- helpers ----------------------------------------------------------------------------------

    def _raw(self, path: str) -> dict | None:
        try:
            answer = self.api.call_api(path, "GET", auth_settings=["BearerToken"], _preload_content=False,
                                       response_type="object")[0]
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(answer.data)

    def _grant(self, namespace: str, account: str) -> None:
        """The roles deploy/ binds to this ServiceAccount, bound to it here as there."""
        rbac = client.RbacAuthorizationV1Api(self.api)
        docs = [d for path in sorted(DEPLOY.rglob("*.yaml")) if "inventory" not in path.parts
                for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind")]
        for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
            if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                       for s in binding.get("subjects") or []):
                continue
            role = next(d for d in docs if d["kind"] == binding["roleRef"]["kind"]
                        and d["metadata"]["name"] == binding["roleRef"]["name"])
            binding = {**binding, "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}
            if binding["kind"] == "ClusterRoleBinding":
                pairs = ((rbac.create_cluster_role, (role,)), (rbac.create_cluster_role_binding, (binding,)))
            else:
                where = binding["metadata"].get("namespace", namespace)
                pairs = ((rbac.create_namespaced_role, (where, role)),
                         (rbac.create_namespaced_role_binding, (where, binding)))
            for create, args in pairs:
                try:
                    create(*args)
                except ApiException as exc:
                    if exc.status != 409:
                        raise

    def _service_accounts(self) -> set[tuple[str, str]]:
        return {(sa.metadata.namespace, sa.metadata.name)
                for ns in self.namespaces for sa in self.core.list_namespaced_service_account(ns).items}

    def _delete_service_account(self, namespace: str, name: str) -> None:
        self._ignore_404(self.core.delete_namespaced_service_account, name, namespace)

    def _add_runtime_class(self, name: str) -> None:
        try:
            self.node_api.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                "metadata": {"name": name}, "handler": name})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _runtime_class_names(self) -> set[str]:
        return {rc.metadata.name for rc in self.node_api.list_runtime_class().items}

    def _clear_runtime_classes(self) -> None:
        for rc in self.node_api.list_runtime_class().items:
            self._ignore_404(self.node_api.delete_runtime_class, rc.metadata.name)

    @staticmethod
    def _ignore_404(fn, *args, **kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status != 404:
                raise
