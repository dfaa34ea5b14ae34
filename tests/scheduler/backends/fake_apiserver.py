"""A small Kubernetes API server for the tests: a real HTTP server on 127.0.0.1 that speaks the part
of the REST API the official client uses for nodes, pods (create, read, patch, delete, list with
selectors and pages, `?watch=true` streams), the Binding subresource and Events.

What it checks like the real one: names, label values, 409 AlreadyExists on create, 409 on a binding
of an already bound pod, resourceVersion preconditions on patch, 410 Gone for a watch that starts
before the retained history. Every object posted to it is validated with `kubernetes-validate`
against Kubernetes 1.34 (strict: unknown fields are errors); an invalid one is answered 422 and kept
in `invalid` so that a test can fail on it.

`resource.k8s.io/v1` (Dynamic Resource Allocation: ResourceSlice, DeviceClass, ResourceClaim with its
status, ResourceClaimTemplate) is served from the same store, with the validation fake_resource_api.py
lists; `remove_node` deletes what the node owns (its slices), `make_template_claims` plays the
resourceclaim controller, `check_allocations` refuses claim allocations that over-commit a device.

Faults: `inject(method, path_regex, status=..., delay_s=..., times=..., after=...)` answers the next
matching requests with an HTTP error, a delay longer than the client's timeout, or (with
`after=True`) performs the request and then answers the error, like an answer lost on the way back.

Admission, as the real API server refuses pods (all 403 Forbidden, with its messages):
- a namespace made with `add_namespace(name, service_account=False)` has no `default`
  ServiceAccount until `add_service_account(name)`: pods are refused meanwhile (the race of a fresh
  namespace, whose ServiceAccount a controller creates a moment later);
- `runtime_classes` (default {"nvidia"}): a pod naming another RuntimeClass is refused;
- a namespace labelled `pod-security.kubernetes.io/enforce: baseline|restricted` refuses pods that
  violate that level (the checks of pod-security-admission that our pods could meet: host
  namespaces, hostPath, privileged, added capabilities, host ports; for restricted also privilege
  escalation, runAsNonRoot and the capabilities not dropped);
- `pod_quota[namespace] = n`: a ResourceQuota of n pods;
- `add_policy(vap)`: a ValidatingAdmissionPolicy (bound with `validationActions: [Deny]`), its CEL
  evaluated with cel-python on pod updates; the requester is who `tokens` maps the request's bearer
  token to (username and extra, e.g. the node-name claim of a bound ServiceAccount token).

Restarts, as a real kube-apiserver goes through them: `go_down()` closes the port (connections are
refused, watches end), `come_back(authorizing_s)` listens again on the same port, and for
`authorizing_s` every request but the health probes (/readyz, /livez, /healthz, which every caller
may read) is refused with RBAC's 403, as a restarted server does until its authorizer's cache of
Roles has synced (about 2 s on a real one). `restart(down_s, authorizing_s)` does both, the second
after `down_s` on a timer.

Answers go out in one write (headers and body together), as the real server's do: a client that
gives a connection back without reading the body then reuses it and fails its next request
(`ResponseNotReady`), so a missing read shows here as it does against a real cluster.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import re
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import celpy
import kubernetes_validate


def _sibling(name: str, filename: str):
    """A module beside this file, by path (the tests are not a package)."""
    import importlib.util
    from pathlib import Path

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


resource_api = _sibling("tessera_tests_fake_resource_api", "fake_resource_api.py")
deep_copy = resource_api.deep_copy

K8S_VERSION = "1.34.0"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int | None
    delay_s: float
    times: int
    after: bool


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str
    user: tuple[str, dict[str, list[str]]] = ("system:anonymous", {})
    code: int = 0  # the answer's status, where known (a real server's audit log says it)


@dataclass
class Store:
    objects: dict[tuple[str, str, str], dict] = field(default_factory=dict)  # (kind, ns, name)
    history: list[tuple[int, str, str, dict]] = field(default_factory=list)  # (rv, kind, type, obj)
    first_rv: int = 1  # the oldest resourceVersion a watch may start from


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, delay_s: float = 0.0) -> None:
        super().__init__(message)
        self.body = _status(code, reason, message)
        self.code = code
        self.delay_s = delay_s  # how long the real server takes to come to this answer


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386; for the label and annotation maps we patch, strategic merge means the same."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def apply_json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 "add" operations (what mutating webhooks send us), applied as the API server does."""
    doc = deep_copy(doc)
    for op in ops:
        if op.get("op") != "add":
            raise ApiError(500, "InternalError", f"the fake applies only 'add' patches, not {op}")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        else:
            target[last] = op["value"]
    return doc


def _selector_matches(selector: str, values: dict[str, str], *, fields: bool) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if values.get(key) == value:
                return False
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            if values.get(key, "" if fields else None) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in values:
                return False
        elif term not in values:
            return False
    return True


def _pod_fields(obj: dict) -> dict[str, str]:
    meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status", {})
    return {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
            "spec.nodeName": spec.get("nodeName", ""), "spec.schedulerName": spec.get("schedulerName", ""),
            "status.phase": status.get("phase", "")}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out and hang up are part of the tests, not an error of the server.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FakeApiServer:
    def __init__(self, namespaces: tuple[str, ...] = ("default", "tessera"), *, validate: bool = True) -> None:
        self.namespaces = set(namespaces)
        # False: skip kubernetes-validate (tens of ms a pod in Python; the real server's validation takes
        # microseconds), for benchmarks that measure our side against a given latency.
        self.validate = validate
        self.created_at: dict[tuple[str, str], float] = {}  # pod -> when it was created (unix seconds)
        self.namespace_labels: dict[str, dict[str, str]] = {ns: {} for ns in namespaces}
        self.service_accounts: set[tuple[str, str]] = {(ns, "default") for ns in namespaces}
        self.runtime_classes: set[str] = {"nvidia"}
        self.pod_quota: dict[str, int] = {}
        # namespace -> how many more pods are refused before its ServiceAccount controller catches up
        self.service_account_after: dict[str, int] = {}
        self.tokens: dict[str, tuple[str, dict[str, list[str]]]] = {}  # bearer token -> (username, extra)
        self.policies: list[dict] = []
        self.pod_logs: dict[tuple[str, str], str] = {}  # what GET .../pods/NAME/log answers
        self.store = Store()
        self.lock = threading.Condition()
        self._rv = itertools.count(1)
        self.faults: list[Fault] = []
        self.requests: list[Request] = []
        self.invalid: list[tuple[dict, str]] = []
        self.validated = 0
        self.hold_deletions = False  # True: deleted pods stay terminating until `finish_deletion`
        self.stopping = False
        self.open_watches = 0
        self.watch_epoch = 0  # bumped by end_watches(): every open watch stream ends
        self.watches_paused = False  # True: open watches deliver nothing until unpaused
        self.garbage: dict[str, int] = {}  # kind -> how many malformed watch events to send
        self.connections = 0  # TCP connections accepted: a client that leaks them opens many
        self.answer_delay_s = 0.0  # every plain (non-watch) answer takes this long, like a busy server
        self.in_flight = self.max_in_flight = 0  # plain requests being answered at once, and the most seen
        # Mutating admission: each is called with a pod being created and answers JSON Patch operations.
        self.pod_mutators: list[Any] = []
        self.authorizer_syncs_at = 0.0  # monotonic time until which RBAC refuses everyone (a restart)
        # resource.k8s.io/v1: refuse claim status writes that over-commit a device (fake_resource_api.py)
        self.check_allocations = True
        self.serves_dra = True  # False: a server before Kubernetes 1.34, without resource.k8s.io/v1
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    # -- life -------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def go_down(self) -> None:
        """Stop listening: connections are refused, open watches end (the first half of a restart)."""
        self.end_watches()
        self._server.shutdown()
        self._server.server_close()

    def come_back(self, authorizing_s: float = 0.5) -> None:
        """Listen again on the same port; RBAC refuses everyone for `authorizing_s` (its cache syncs)."""
        with self.lock:
            self.authorizer_syncs_at = time.monotonic() + authorizing_s
        self._server = _Server(self._server.server_address[:2], self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def restart(self, down_s: float = 0.5, authorizing_s: float = 0.5) -> threading.Timer:
        """Go down now and come back after `down_s`, in the background (join the timer to wait)."""
        self.go_down()
        timer = threading.Timer(down_s, self.come_back, args=(authorizing_s,))
        timer.start()
        return timer

    # -- what tests do from "outside" (kubelet, users, controllers) ---------------------------------

    def add_node(self, name: str, ready: bool = True, address: str | None = None) -> dict:
        """A node; with `address`, its status lists it as InternalIP (and its name as Hostname), as
        the kubelet reports them."""
        obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}, "uid": str(uuid.uuid4())},
               "status": {"conditions": [self._ready_condition(ready)]}}
        if address:
            obj["status"]["addresses"] = [{"type": "Hostname", "address": name},
                                          {"type": "InternalIP", "address": address}]
        with self.lock:
            return self._put("Node", "", name, obj, "ADDED")

    def add_namespace(self, name: str, labels: dict[str, str] | None = None, *,
                      service_account: bool = True) -> None:
        with self.lock:
            self.namespaces.add(name)
            self.namespace_labels[name] = dict(labels or {})
            if service_account:
                self.service_accounts.add((name, "default"))

    def add_policy(self, policy: dict) -> None:
        assert policy["kind"] == "ValidatingAdmissionPolicy"
        with self.lock:
            self.policies.append(deep_copy(policy))

    def add_service_account(self, namespace: str, name: str = "default") -> None:
        with self.lock:
            self.service_accounts.add((namespace, name))

    def remove_node(self, name: str) -> None:
        """Delete a node; the objects whose ownerReferences name it go too, as the garbage collector
        deletes them (a DRA driver's ResourceSlices)."""
        with self.lock:
            node = self.store.objects.pop(("Node", "", name))
            self._record("Node", "DELETED", node)
            uid = node["metadata"]["uid"]
            for key, obj in list(self.store.objects.items()):
                if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ()):
                    del self.store.objects[key]
                    self._record(key[0], "DELETED", obj)

    def objects(self, kind: str) -> list[dict]:
        """Every stored object of a kind (e.g. "ResourceSlice", "ResourceClaim")."""
        with self.lock:
            return [deep_copy(o) for (k, _, _), o in self.store.objects.items() if k == kind]

    def put_object(self, obj: dict) -> dict:
        """Create or replace an object from outside (a user's kubectl apply), validated as a request is."""
        kind, meta = obj["kind"], obj["metadata"]
        self._validate(obj)
        with self.lock:
            key = (kind, meta.get("namespace", ""), meta["name"])
            old = self.store.objects.get(key)
            new = deep_copy(obj)
            if old is None:
                new = resource_api.new_object(kind, key[1], new) if obj["apiVersion"] == resource_api.API_VERSION \
                    else new
            else:
                new["metadata"]["uid"] = old["metadata"]["uid"]
            return self._put(kind, key[1], key[2], new, "MODIFIED" if old else "ADDED")

    def make_template_claims(self, namespace: str, pod_name: str) -> list[dict]:
        """What the resourceclaim controller does for a new pod: a claim from each ResourceClaimTemplate
        it names (owned by the pod), recorded in the pod's status.resourceClaimStatuses."""
        with self.lock:
            pod = deep_copy(self.store.objects[("Pod", namespace, pod_name)])
            made, statuses = [], []
            for ref in pod["spec"].get("resourceClaims") or ():
                if not ref.get("resourceClaimTemplateName"):
                    continue
                template = self.store.objects[("ResourceClaimTemplate", namespace, ref["resourceClaimTemplateName"])]
                name = f"{pod_name}-{ref['name']}-{uuid.uuid4().hex[:5]}"
                claim = resource_api.new_object("ResourceClaim", namespace, {
                    "apiVersion": resource_api.API_VERSION, "kind": "ResourceClaim",
                    "metadata": {**deep_copy(template["spec"].get("metadata") or {}), "name": name,
                                 "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                                      "uid": pod["metadata"]["uid"], "controller": True}]},
                    "spec": deep_copy(template["spec"]["spec"])})
                made.append(self._put("ResourceClaim", namespace, name, claim, "ADDED"))
                statuses.append({"name": ref["name"], "resourceClaimName": name})
            pod.setdefault("status", {})["resourceClaimStatuses"] = statuses
            self._put("Pod", namespace, pod_name, pod, "MODIFIED")
            return made

    def set_node_ready(self, name: str, ready: bool) -> None:
        with self.lock:
            obj = deep_copy(self.store.objects[("Node", "", name)])
            obj["status"]["conditions"] = [self._ready_condition(ready)]
            self._put("Node", "", name, obj, "MODIFIED")

    def create_pod(self, manifest: dict) -> dict:
        """A pod as a user would make it with kubectl (not validated as ours are)."""
        with self.lock:
            return self._create_pod(manifest["metadata"]["namespace"], deep_copy(manifest))

    def set_pod_phase(self, namespace: str, name: str, phase: str, reason: str = "",
                      container_reason: str = "") -> None:
        with self.lock:
            obj = deep_copy(self.store.objects[("Pod", namespace, name)])
            obj["status"]["phase"] = phase
            if reason:
                obj["status"]["reason"] = reason
            if container_reason:
                obj["status"]["containerStatuses"] = [
                    {"name": "main", "state": {"terminated": {"reason": container_reason, "exitCode": 1}}}]
            self._put("Pod", namespace, name, obj, "MODIFIED")

    def remove_pod(self, namespace: str, name: str) -> None:
        """Gone at once, as after `kubectl delete --force` or the end of a graceful deletion."""
        with self.lock:
            obj = self.store.objects.pop(("Pod", namespace, name))
            self._record("Pod", "DELETED", obj)
            self._collect_owned(obj)

    def _collect_owned(self, owner: dict) -> None:
        """What the garbage collector does once an object is gone: the objects its uid owns (a pod's
        ResourceClaims) are deleted too."""
        uid = owner["metadata"].get("uid")
        for key, obj in list(self.store.objects.items()):
            if uid and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ()):
                del self.store.objects[key]
                self._record(key[0], "DELETED", obj)

    def begin_deletion(self, namespace: str, name: str) -> None:
        """`kubectl delete` of a pod whose containers are still stopping: deletionTimestamp set (a
        pod on no node and without finalizers is gone at once instead, as on a real server)."""
        with self.lock:
            obj = deep_copy(self.store.objects[("Pod", namespace, name)])
            obj["metadata"]["deletionTimestamp"] = _now()
            self._put("Pod", namespace, name, obj, "MODIFIED")
            if not self._stays_terminating(obj, 30, kubelet_slow=True):
                self.store.objects.pop(("Pod", namespace, name))
                self._record("Pod", "DELETED", obj)
                self._collect_owned(obj)

    def finish_deletion(self, namespace: str, name: str) -> None:
        self.remove_pod(namespace, name)

    def pod(self, namespace: str, name: str) -> dict | None:
        with self.lock:
            obj = self.store.objects.get(("Pod", namespace, name))
            return deep_copy(obj) if obj else None

    def pods(self) -> list[dict]:
        with self.lock:
            return [deep_copy(o) for (k, _, _), o in self.store.objects.items() if k == "Pod"]

    def events(self) -> list[dict]:
        with self.lock:
            return [deep_copy(o) for (k, _, _), o in self.store.objects.items() if k == "Event"]

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: older watches get 410 Gone."""
        with self.lock:
            self.store.history.clear()
            self.store.first_rv = next(self._rv)
            self.lock.notify_all()

    def end_watches(self) -> None:
        """End every open watch stream, as an API server does at its timeout or on restart."""
        with self.lock:
            self.watch_epoch += 1
            self.lock.notify_all()

    def pause_watches(self, paused: bool) -> None:
        """While paused, open watches deliver nothing (so a test can make history expire under them)."""
        with self.lock:
            self.watches_paused = paused
            self.lock.notify_all()

    def inject(self, method: str, path: str, *, status: int | None = 500, delay_s: float = 0.0,
               times: int = 1, after: bool = False) -> None:
        with self.lock:
            self.faults.append(Fault(method.upper(), re.compile(path), status, delay_s, times, after))

    def faults_left(self) -> int:
        with self.lock:
            return sum(f.times for f in self.faults)

    def calls(self, method: str, path: str) -> list[Request]:
        pattern = re.compile(path)
        with self.lock:
            return [r for r in self.requests if r.method == method and pattern.search(r.path)]

    # -- the store --------------------------------------------------------------------------------

    @staticmethod
    def _ready_condition(ready: bool) -> dict:
        return {"type": "Ready", "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "NodeStatusUnknown"}

    def _record(self, kind: str, typ: str, obj: dict) -> None:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        self.store.history.append((rv, kind, typ, deep_copy(obj)))
        self.lock.notify_all()

    def _put(self, kind: str, ns: str, name: str, obj: dict, typ: str) -> dict:
        self._record(kind, typ, obj)
        self.store.objects[(kind, ns, name)] = obj
        return deep_copy(obj)

    def _create_pod(self, ns: str, body: dict) -> dict:
        meta = body.setdefault("metadata", {})
        name = meta.get("name", "")
        if ns not in self.namespaces:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        if not _DNS_LABEL.match(name) or len(name) > 63:
            raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: metadata.name')
        for key, value in (meta.get("labels") or {}).items():
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise ApiError(422, "Invalid", f"metadata.labels: Invalid value: {value!r} for {key}")
        if ("Pod", ns, name) in self.store.objects:
            raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
        for mutate in self.pod_mutators:
            body = apply_json_patch(body, mutate(body))
            meta = body["metadata"]
        self._admit_pod(ns, name, body)
        default_pod(body.setdefault("spec", {}))
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
        body.setdefault("spec", {}).setdefault("schedulerName", "default-scheduler")
        body["status"] = {"phase": "Pending"}
        self.created_at[(ns, name)] = time.time()
        return self._put("Pod", ns, name, body, "ADDED")

    def _admit_pod(self, ns: str, name: str, body: dict) -> None:
        """The admission plugins that refuse pods, in the API server's order and words."""
        spec = body.get("spec") or {}
        forbidden = f'pods "{name}" is forbidden: '
        account = spec.get("serviceAccountName") or "default"
        if (ns, account) not in self.service_accounts and account == "default" and ns in self.service_account_after:
            self.service_account_after[ns] -= 1
            if self.service_account_after[ns] < 0:
                self.service_accounts.add((ns, account))
        if (ns, account) not in self.service_accounts:
            # The real ServiceAccount admission looks the default account up 10 times, 100-200 ms
            # apart, before it refuses (its controller may be about to create it): 0.9-1.8 s.
            delay = 9 * random.uniform(0.1, 0.2) if account == "default" else 0.0
            raise ApiError(403, "Forbidden", f"{forbidden}error looking up service account {ns}/{account}: "
                           f'serviceaccount "{account}" not found', delay_s=delay)
        runtime_class = spec.get("runtimeClassName")
        if runtime_class and runtime_class not in self.runtime_classes:
            raise ApiError(403, "Forbidden", f'{forbidden}pod rejected: RuntimeClass "{runtime_class}" not found')
        level = self.namespace_labels.get(ns, {}).get("pod-security.kubernetes.io/enforce", "privileged")
        if level in ("baseline", "restricted"):
            violations = pod_security_violations(spec, restricted=level == "restricted")
            if violations:
                raise ApiError(403, "Forbidden", f'{forbidden}violates PodSecurity "{level}:latest": '
                               + ", ".join(violations))
        quota = self.pod_quota.get(ns)
        if quota is not None:
            used = sum(1 for (k, n, _) in self.store.objects if k == "Pod" and n == ns)
            if used >= quota:
                raise ApiError(403, "Forbidden", f"{forbidden}exceeded quota: pods, requested: pods=1, "
                               f"used: pods={used}, limited: pods={quota}")

    def _validate(self, body: Any) -> None:
        if not self.validate:
            return
        self.validated += 1
        try:
            kubernetes_validate.validate(body, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append((body, str(exc)))
            raise ApiError(422, "Invalid", f"invalid {body.get('kind')}: {exc}") from exc

    # -- HTTP -------------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked watch streams need it

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # Headers and body go out as separate writes: without this, Nagle's algorithm and the
                # client's delayed ACK add ~40 ms to every answer.
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with server.lock:
                    server.connections += 1

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    self._send(400, _status(400, "BadRequest", "invalid JSON"))
                    return
                auth = self.headers.get("Authorization", "")
                user = server.tokens.get(auth.removeprefix("Bearer "), ("system:anonymous", {}))
                request = Request(method, parts.path, query, body, self.headers.get("Content-Type", ""), user)
                with server.lock:
                    server.requests.append(request)
                    fault = server._take_fault(method, parts.path + ("?watch" if _is_watch(query) else ""))
                if fault and not fault.after:
                    self._fault(fault)
                    return
                if parts.path not in _HEALTH_PATHS and time.monotonic() < server.authorizer_syncs_at:
                    self._send(403, _rbac_refusal(method, parts.path, query, user[0]))
                    return
                if method == "GET" and _is_watch(query):
                    self._watch(parts.path, query)
                    return
                with server.lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.answer_delay_s)
                    code, answer = server._route(request)
                except ApiError as exc:
                    time.sleep(exc.delay_s)
                    code, answer = exc.code, exc.body
                finally:
                    with server.lock:
                        server.in_flight -= 1
                if fault:
                    self._fault(fault)
                    return
                self._send(code, answer)

            def _fault(self, fault: Fault) -> None:
                if fault.delay_s:
                    time.sleep(fault.delay_s)
                code = fault.status or 504
                with contextlib.suppress(OSError):  # the client may have given up waiting
                    self._send(code, _status(code, "InternalError" if code >= 500 else "Conflict",
                                             "injected fault"))

            def _send(self, code: int, body: dict | str) -> None:
                text = isinstance(body, str)  # a pod's log is plain text
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                # Headers and body in one write, as the real API server's answers arrive: the client
                # then reads the body into its buffer with the headers, and a connection given back
                # with its body unread looks idle and is reused (see `_check_reused`).
                self._headers_buffer.append(b"\r\n")
                self.wfile.write(b"".join(self._headers_buffer) + data)
                self._headers_buffer = []

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _watch(self, path: str, query: dict[str, str]) -> None:
                kind, ns = _watched(path)
                deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
                labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                rv = int(query.get("resourceVersion") or 0)
                with server.lock:
                    server.open_watches += 1
                    epoch = server.watch_epoch
                try:
                    with server.lock:
                        if rv and rv < server.store.first_rv - 1:
                            gone = _status(410, "Expired", f"too old resource version: {rv}")
                            self._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                            self._chunk(b"")
                            return
                        if not rv:  # from now, starting with the current objects as ADDED
                            pending = [(0, "ADDED", o) for (k, n, _), o in server.store.objects.items()
                                       if k == kind and (not ns or n == ns)]
                            rv = server.store.history[-1][0] if server.store.history else 0
                        else:
                            pending = []
                    while True:
                        with server.lock:
                            garbled = server.garbage.get(kind, 0)
                            server.garbage[kind] = max(0, garbled - 1)
                        if garbled:
                            self._chunk(b'{"type": "MODIFIED", "object": 42}\n')
                        for _, typ, obj in pending:
                            if server._visible(kind, obj, labels, fields):
                                line = json.dumps({"type": typ, "object": obj}).encode() + b"\n"
                                self._chunk(line)
                        with server.lock:
                            pending = []
                            while not pending:
                                if server.stopping or time.monotonic() >= deadline:
                                    self._chunk(b"")
                                    return
                                if rv < server.store.first_rv - 1 or server.watch_epoch != epoch:
                                    break  # compacted under us, or ended: the client will watch again
                                if not server.watches_paused:
                                    pending = [(r, t, o) for r, k, t, o in server.store.history if r > rv
                                               and k == kind and (not ns or o["metadata"].get("namespace") == ns)]
                                if not pending:
                                    server.lock.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                            if not pending:
                                self._chunk(b"")
                                return
                            rv = pending[-1][0]
                except OSError:
                    pass  # the client went away
                finally:
                    with server.lock:
                        server.open_watches -= 1

        return Handler

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method == method and fault.times > 0 and fault.path.search(path):
                fault.times -= 1
                return fault
        return None

    def _visible(self, kind: str, obj: dict, labels: str, fields: str) -> bool:
        values = obj["metadata"].get("labels") or {}
        if labels and not _selector_matches(labels, values, fields=False):
            return False
        if fields and kind == "ResourceSlice":
            spec = obj.get("spec") or {}
            return _selector_matches(fields, {"spec.nodeName": spec.get("nodeName", ""),
                                              "spec.driver": spec.get("driver", "")}, fields=True)
        return not (fields and kind == "Pod" and not _selector_matches(fields, _pod_fields(obj), fields=True))

    def _list(self, kind: str, ns: str, query: dict[str, str], api_version: str = "v1") -> dict:
        with self.lock:
            items = sorted(((n, name), o) for (k, n, name), o in self.store.objects.items()
                           if k == kind and (not ns or n == ns))
            rv = str(self.store.history[-1][0] if self.store.history else 0)
        items = [deep_copy(o) for _, o in items
                 if self._visible(kind, o, query.get("labelSelector", ""), query.get("fieldSelector", ""))]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": rv}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": page}

    def _route(self, req: Request) -> tuple[int, dict | str]:
        path, m = req.path, None
        if path in _HEALTH_PATHS and req.method == "GET":
            return 200, "ok"
        if path == "/api/v1/nodes" and req.method == "GET":
            return 200, self._list("Node", "", req.query)
        if (where := resource_api.route(path)) is not None:
            if not self.serves_dra:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._resource(req, *where)
        if (m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path)) and req.method == "GET":
            return 200, self._get("Node", "", m[1])
        if path == "/api/v1/pods" and req.method == "GET":
            return 200, self._list("Pod", "", req.query)
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path):
            if req.method == "GET":
                return 200, self._list("Pod", m[1], req.query)
            if req.method == "POST":
                self._validate(req.body)
                with self.lock:
                    return 201, self._create_pod(m[1], deep_copy(req.body))
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path):
            ns, name = m[1], m[2]
            if req.method == "GET":
                return 200, self._get("Pod", ns, name)
            if req.method == "PATCH":
                return 200, self._patch_pod(ns, name, req)
            if req.method == "DELETE":
                return 200, self._delete_pod(ns, name, req)
        if (m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", path)) and req.method == "GET":
            self._get("Pod", m[1], m[2])
            lines = self.pod_logs.get((m[1], m[2]), "").splitlines(keepends=True)
            tail = int(req.query.get("tailLines") or 0)
            return 200, "".join(lines[-tail:] if tail else lines)
        if (m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding", path)) and req.method == "POST":
            self._validate(req.body)
            return 201, self._bind(m[1], m[2], req.body)
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path):
            if req.method == "POST":
                self._validate(req.body)
                return 201, self._create_event(m[1], req.body)
            if req.method == "GET":
                return 200, self._list("Event", m[1], req.query)
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events/([^/]+)", path):
            if req.method == "GET":
                return 200, self._get("Event", m[1], m[2])
            if req.method == "PATCH":
                return 200, self._patch_event(m[1], m[2], req)
        raise ApiError(404, "NotFound", f"the fake API server has no {req.method} {path}")

    def _resource(self, req: Request, plural: str, ns: str, name: str, sub: str) -> tuple[int, dict]:
        """resource.k8s.io/v1: list, get, create, replace (PUT), merge-patch, delete; `status` of claims."""
        kind, _ = resource_api.RESOURCES[plural]
        if sub and (sub != "status" or kind != "ResourceClaim"):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({plural}/{sub})")
        if ns and ns not in self.namespaces:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        if req.method == "GET":
            return 200, (self._get(kind, ns, name) if name else
                         self._list(kind, ns, req.query, resource_api.API_VERSION))
        if req.method == "POST" and not name:
            body = req.body or {}
            if body.get("kind") != kind:
                raise ApiError(400, "BadRequest", f"the body is a {body.get('kind')}, not a {kind}")
            self._validate(body)
            with self.lock:
                obj = resource_api.new_object(kind, ns, body)
                key = (kind, ns, obj["metadata"].get("name", ""))
                if key in self.store.objects:
                    raise ApiError(409, "AlreadyExists", f'{plural}.resource.k8s.io "{key[2]}" already exists')
                if kind == "ResourceClaim":
                    obj["status"] = {}  # the status subresource: a create does not set it
                self._check_resource(kind, obj, None, status=False)
                self._admit(req, "CREATE", plural, obj, None)
                return 201, self._put(kind, ns, key[2], obj, "ADDED")
        if req.method in ("PUT", "PATCH") and name:
            with self.lock:
                old = self.store.objects.get((kind, ns, name))
                if old is None:
                    raise ApiError(404, "NotFound", f'{plural}.resource.k8s.io "{name}" not found')
                body = req.body or {}
                if req.method == "PATCH":
                    if "merge-patch" not in req.content_type:
                        raise ApiError(415, "UnsupportedMediaType",
                                       f"the fake supports merge patches, not {req.content_type}")
                    body = merge_patch(old, body)
                want_rv = (body.get("metadata") or {}).get("resourceVersion")
                if want_rv and want_rv != old["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural}.resource.k8s.io '
                                   f'"{name}": the object has been modified; please apply your changes to the '
                                   "latest version and try again")
                if sub == "status":
                    # Only the status is new: the rest is shared with the stored object this replaces
                    # (stored objects are never changed in place), so a status write copies no spec.
                    new = {**old, "metadata": dict(old["metadata"]), "status": deep_copy(body.get("status") or {})}
                else:
                    new = deep_copy(old)
                    new.update({k: deep_copy(v) for k, v in body.items() if k not in ("metadata", "status")})
                    for key in ("labels", "annotations", "ownerReferences", "finalizers"):
                        if key in (body.get("metadata") or {}):
                            new["metadata"][key] = deep_copy(body["metadata"][key])
                    if new.get("spec") != old.get("spec"):
                        new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
                self._validate(new)
                self._check_resource(kind, new, old, status=sub == "status")
                self._admit(req, "UPDATE", plural, new, old)
                return 200, self._put(kind, ns, name, new, "MODIFIED")
        if req.method == "DELETE" and name:
            with self.lock:
                obj = self.store.objects.get((kind, ns, name))
                if obj is None:
                    raise ApiError(404, "NotFound", f'{plural}.resource.k8s.io "{name}" not found')
                self._admit(req, "DELETE", plural, None, obj)
                del self.store.objects[(kind, ns, name)]
                self._record(kind, "DELETED", obj)
                return 200, deep_copy(obj)
        raise ApiError(405, "MethodNotAllowed", f"the fake has no {req.method} for {plural}")

    def _admit(self, req: Request, operation: str, plural: str, obj: dict | None, old: dict | None) -> None:
        """The ValidatingAdmissionPolicies added with `add_policy`, as for pods."""
        for policy in self.policies:
            denied = policy_denial(policy, operation, plural, obj, old, req.user)
            if denied:
                code, reason, message = denied
                name = (obj or old or {}).get("metadata", {}).get("name", "")
                raise ApiError(code, reason, f'{plural}.resource.k8s.io "{name}" is forbidden: {message}')

    def _check_resource(self, kind: str, obj: dict, old: dict | None, *, status: bool) -> None:
        """resource.k8s.io/v1 semantics beyond the schema (fake_resource_api.py says which)."""
        try:
            if kind == "ResourceSlice":
                resource_api.validate_slice(obj, old)
            elif kind == "ResourceClaim" and old is not None:
                if not status and obj.get("spec") != old.get("spec"):
                    raise resource_api.Invalid("spec: Invalid value: field is immutable")
                if status:
                    resource_api.validate_claim_status(obj, old)
                    if self.check_allocations:
                        self._check_allocations(obj)
        except resource_api.Invalid as exc:
            name = obj["metadata"].get("name", "")
            message = f'{kind}.resource.k8s.io "{name}" is invalid: {exc}'
            self.invalid.append((obj, message))
            raise ApiError(422, "Invalid", message) from exc

    def _check_allocations(self, claim: dict) -> None:
        key = ("ResourceClaim", claim["metadata"].get("namespace", ""), claim["metadata"]["name"])
        claims = {k: o for k, o in self.store.objects.items() if k[0] == "ResourceClaim"}
        slices = [o for k, o in self.store.objects.items() if k[0] == "ResourceSlice"]
        before = set(resource_api.allocation_problems(list(claims.values()), slices))
        claims[key] = claim
        after = [p for p in resource_api.allocation_problems(list(claims.values()), slices) if p not in before]
        if after:
            raise resource_api.Invalid("status.allocation: Invalid value: " + "; ".join(after))

    def _get(self, kind: str, ns: str, name: str) -> dict:
        with self.lock:
            obj = self.store.objects.get((kind, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            return deep_copy(obj)

    def _patch_pod(self, ns: str, name: str, req: Request) -> dict:
        if "merge-patch" not in req.content_type:
            raise ApiError(415, "UnsupportedMediaType", f"the fake supports merge patches, not {req.content_type}")
        with self.lock:
            obj = self.store.objects.get(("Pod", ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            want_rv = ((req.body or {}).get("metadata") or {}).get("resourceVersion")
            if want_rv and want_rv != obj["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": '
                               "the object has been modified")
            patched = merge_patch(obj, req.body)
            patched["metadata"]["name"], patched["metadata"]["namespace"] = name, ns
            for key, value in (patched["metadata"].get("labels") or {}).items():
                if len(value) > 63 or not _LABEL_VALUE.match(value):
                    raise ApiError(422, "Invalid", f"metadata.labels: Invalid value: {value!r} for {key}")
            for policy in self.policies:
                denied = policy_denial(policy, "UPDATE", "pods", patched, obj, req.user)
                if denied:
                    code, reason, message = denied
                    raise ApiError(code, reason, f'pods "{name}" is forbidden: {message}')
            return self._put("Pod", ns, name, patched, "MODIFIED")

    def _delete_pod(self, ns: str, name: str, req: Request) -> dict:
        with self.lock:
            obj = self.store.objects.get(("Pod", ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            grace = int(req.query.get("gracePeriodSeconds") or 30)
            obj = deep_copy(obj)
            obj["metadata"]["deletionTimestamp"] = _now()
            obj["metadata"]["deletionGracePeriodSeconds"] = grace
            out = self._put("Pod", ns, name, obj, "MODIFIED")
            if not self._stays_terminating(obj, grace, kubelet_slow=self.hold_deletions):
                self.store.objects.pop(("Pod", ns, name))
                self._record("Pod", "DELETED", obj)
                self._collect_owned(obj)
            return out

    @staticmethod
    def _stays_terminating(obj: dict, grace: int, *, kubelet_slow: bool) -> bool:
        """As the real server: a pod with finalizers waits for them; a pod bound to a node waits
        for its kubelet (here: while `kubelet_slow`) unless deleted with grace 0; a pod on no node
        goes at once, since no kubelet has anything to stop."""
        bound = bool((obj.get("spec") or {}).get("nodeName"))
        return bool(obj["metadata"].get("finalizers")) or (bound and grace > 0 and kubelet_slow)

    def _patch_event(self, ns: str, name: str, req: Request) -> dict:
        if "merge-patch" not in req.content_type:
            raise ApiError(415, "UnsupportedMediaType", f"the fake supports merge patches, not {req.content_type}")
        with self.lock:
            obj = self.store.objects.get(("Event", ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'events "{name}" not found')
            patched = merge_patch(obj, req.body)
            patched["metadata"]["name"], patched["metadata"]["namespace"] = name, ns
            self._validate(patched)
            return self._put("Event", ns, name, patched, "MODIFIED")

    def _bind(self, ns: str, name: str, body: dict) -> dict:
        with self.lock:
            obj = self.store.objects.get(("Pod", ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            bound = obj.get("spec", {}).get("nodeName")
            if bound:
                raise ApiError(409, "Conflict", f"pod {name} is already assigned to node {bound!r}")
            obj = deep_copy(obj)
            obj["spec"]["nodeName"] = body["target"]["name"]
            # As setPodHostAndAnnotations does: the Binding's annotations go onto the pod.
            obj["metadata"].setdefault("annotations", {}).update((body.get("metadata") or {}).get("annotations") or {})
            # As the real API server does on a binding.
            obj["status"].setdefault("conditions", []).append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()})
            self._put("Pod", ns, name, obj, "MODIFIED")
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _create_event(self, ns: str, body: dict) -> dict:
        with self.lock:
            name = body["metadata"]["name"]
            if ("Event", ns, name) in self.store.objects:
                raise ApiError(409, "AlreadyExists", f'events "{name}" already exists')
            body = deep_copy(body)
            body["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
            return self._put("Event", ns, name, body, "ADDED")


_HEALTH_PATHS = frozenset({"/readyz", "/livez", "/healthz"})


def _rbac_refusal(method: str, path: str, query: dict[str, str], username: str) -> dict:
    """RBAC's 403 for a request, in the RBAC authorizer's words."""
    parts = path.strip("/").split("/")[2:]  # past api/v1
    namespace = ""
    if len(parts) >= 2 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    resource = "/".join(parts[:1] + parts[2:3]) or "namespaces"
    name = parts[1] if len(parts) > 1 else ""
    verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete"}.get(method) or (
        "get" if name else "watch" if _is_watch(query) else "list")
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    subject = f'{resource} "{name}"' if name else resource
    return _status(403, "Forbidden", f'{subject} is forbidden: User "{username}" cannot {verb} resource '
                                     f'"{resource}" in API group "" {where}')


def policy_denial(policy: dict, operation: str, resource: str, obj: dict, old: dict | None,
                  user: tuple[str, dict[str, list[str]]]) -> tuple[int, str, str] | None:
    """(HTTP code, reason, message) when the ValidatingAdmissionPolicy denies the request, else None.
    Evaluates its matchConditions, variables and validations with cel-python, as the API server does
    with cel-go (same expressions, same `object`/`oldObject`/`request`/`variables`)."""
    spec = policy["spec"]
    if not any(operation in rule.get("operations", ()) and resource in rule.get("resources", ())
               for rule in spec["matchConstraints"]["resourceRules"]):
        return None
    env = celpy.Environment()
    username, extra = user
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": operation, "userInfo": {"username": username, "extra": extra}}),
    }

    def evaluate(expression: str) -> Any:
        return env.program(env.compile(expression)).evaluate(activation)

    if not all(bool(evaluate(c["expression"])) for c in spec.get("matchConditions") or ()):
        return None
    variables = celpy.celtypes.MapType()
    activation["variables"] = variables
    for variable in spec.get("variables") or ():
        variables[celpy.celtypes.StringType(variable["name"])] = evaluate(variable["expression"])
    for check in spec.get("validations") or ():
        result = evaluate(check["expression"])
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            message = str(evaluate(check["messageExpression"])) if check.get("messageExpression") \
                else check.get("message") or f"failed expression: {check['expression']}"
            reason = check.get("reason", "Invalid")
            code = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413}.get(reason, 422)
            name = policy["metadata"]["name"]
            return code, reason, f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {message}"
    return None


# pod-security-admission's baseline: capabilities a container may add.
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})


def default_pod(spec: dict) -> None:
    """What the real server adds to every pod that our tests could trip over: requests equal to the
    limits where a resource has only a limit (defaulting), and the NoExecute tolerations for
    not-ready and unreachable nodes (admission plugin DefaultTolerationSeconds)."""
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        resources = container.get("resources") or {}
        if resources.get("limits"):
            requests = resources.setdefault("requests", {})
            for key, value in resources["limits"].items():
                requests.setdefault(key, value)
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") in (key, None, "") and t.get("effect") in ("NoExecute", None, "") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})


def pod_security_violations(spec: dict, *, restricted: bool = False) -> list[str]:
    """What a pod spec does that the PodSecurity level forbids, worded as pod-security-admission does."""
    out = []
    hosts = [f"{k}={str(spec[k]).lower()}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        out.append(f"host namespaces ({', '.join(hosts)})")
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    privileged = [c["name"] for c in containers if ((c.get("securityContext") or {}).get("privileged"))]
    if privileged:
        out.append(f"privileged ({', '.join(privileged)})")
    added = sorted({cap for c in containers for cap in
                    (((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or ())
                    if restricted or cap not in BASELINE_CAPABILITIES})
    if added:
        out.append(f"non-default capabilities (capabilities {', '.join(added)})")
    host_paths = [v["name"] for v in spec.get("volumes") or () if "hostPath" in v]
    if host_paths:
        out.append("hostPath volumes (volumes " + ", ".join(f'"{n}"' for n in host_paths) + ")")
    ports = [str(p["hostPort"]) for c in containers for p in c.get("ports") or () if p.get("hostPort")]
    if ports:
        out.append(f"hostPort (ports {', '.join(ports)})")
    if restricted:
        pod_sc = spec.get("securityContext") or {}
        escalating = [c["name"] for c in containers
                      if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
        if escalating:
            out.append(f"allowPrivilegeEscalation != false (containers {', '.join(escalating)})")
        not_dropped = [c["name"] for c in containers if "ALL" not in (
            ((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or ())]
        if not_dropped:
            out.append(f"unrestricted capabilities (containers {', '.join(not_dropped)})")
        root = [c["name"] for c in containers
                if not (c.get("securityContext") or {}).get("runAsNonRoot", pod_sc.get("runAsNonRoot"))]
        if root:
            out.append(f"runAsNonRoot != true (containers {', '.join(root)})")
    return out


def _is_watch(query: dict[str, str]) -> bool:
    return query.get("watch") in ("true", "1", "True")


def _watched(path: str) -> tuple[str, str]:
    if path == "/api/v1/nodes":
        return "Node", ""
    if path == "/api/v1/pods":
        return "Pod", ""
    if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path):
        return "Pod", m[1]
    where = resource_api.route(path)
    if where and not where[2]:
        return resource_api.RESOURCES[where[0]][0], where[1]
    raise ApiError(404, "NotFound", f"cannot watch {path}")
