"""Kubernetes objects as plain dicts, both ways: the manifests the backend sends (pods, bindings,
events) and the `scheduler.backends.base` values it reads back from pods and nodes.

Manifests are dicts rather than client models so that what we validate is byte for byte what goes
over the wire.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from wire.pod_placement import PlacementError, parse_placement

from ..base import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    REMOTE_CLIENT_DIR,
    RESERVATION_LABEL,
    SCHEDULER_NAME,
    ExternalPod,
    GpuShare,
    NodeCondition,
    PermanentBackendError,
    Phase,
    PodSpec,
    PodStatus,
    remote_share_env,
    share_env,
)

CONTAINER_NAME = "main"
GRACE_S = 30
# The device plugin's extended resource (agents/deviceplugin): asking for one slot makes the kubelet
# call its Allocate, which answers the share variables, the preload library and the broker socket.
SHARE_RESOURCE = "tessera.io/gpu-share"
# The app port the portal's proxy reaches (portal.connect.access.app_env sets it); its name is what
# deploy/'s NetworkPolicy admits the portal to.
APP_PORT_ENV = "TESSERA_APP_PORT"
APP_PORT_NAME = "tessera-app"
APP_LABEL = "sharedgpu/app"

# What Allocate gives the container: left out of the pod spec (one source, and a user's env cannot
# override it there).
SHARE_ENV_NAMES = frozenset(share_env("0", (GpuShare("GPU-0", 0, 1.0, 1.0, 1),), 0))
REMOTE_ENV_NAMES = frozenset(remote_share_env("0", "server:1", "token"))
# Remote shares: the image holding the client libraries (the agent image, see Dockerfile), where
# they are in it, the user it runs as there, and the pod's volume and init container.
DEFAULT_CLIENT_IMAGE = "tessera/agent:0.1.0"
CLIENT_IMAGE_DIR = "/usr/lib/tessera/remote/client"
CLIENT_IMAGE_UID = 10001
CLIENT_VOLUME = "tessera-remote-client"
CLIENT_INIT_NAME = "tessera-remote-client"

# The API server's own rules for names and labels (a violation is a 422 there; we say it first).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def check_name(kind: str, name: str, *, dns_label: bool = False) -> None:
    pattern, limit = (_DNS_LABEL, 63) if dns_label else (_DNS_SUBDOMAIN, 253)
    if not name or len(name) > limit or not pattern.match(name):
        raise PermanentBackendError(
            f"{kind} {name!r} is not a valid Kubernetes name (lower-case letters, digits and '-', "
            f"at most {limit} characters)")


def check_labels(labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or not (
                0 < len(name) <= 63 and _LABEL_NAME.match(name)):
            raise PermanentBackendError(f"label key {key!r} is not a valid Kubernetes label key")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise PermanentBackendError(
                f"label {key}={value!r} is not a valid Kubernetes label value (at most 63 of "
                "letters, digits, '-', '_', '.', starting and ending with a letter or digit)")


def pod_manifest(spec: PodSpec, *, runtime_class: str | None = "nvidia", tolerate_gpu_taint: bool = True,
                 client_image: str = DEFAULT_CLIENT_IMAGE) -> dict[str, Any]:
    """The pod for one reservation: pinned to its node (`nodeName`, so no scheduler runs), asking for
    one `SHARE_RESOURCE` slot. The GPU (`NVIDIA_VISIBLE_DEVICES`), the share variables, the preload
    library and the broker socket come from the device plugin's Allocate answer, as for kubectl
    pods: the spec has no hostPath and passes PodSecurity `baseline`.

    A remote share's pod (`spec.remote`) runs on a node without its GPU, where no device plugin
    runs: it asks for no share slot and no NVIDIA runtime; an init container from `client_image`
    copies the client libraries into an emptyDir the workload sees at `REMOTE_CLIENT_DIR`
    (`LD_LIBRARY_PATH`), and its env carries the server and the share token. Still no hostPath."""
    check_name("pod", spec.name, dns_label=True)
    check_name("namespace", spec.namespace, dns_label=True)
    check_name("node", spec.node)
    labels = dict(spec.labels)
    check_labels(labels)
    if not spec.image.strip():
        raise PermanentBackendError("image: a pod needs a container image")
    for key, _ in spec.env:
        if not _ENV_NAME.match(key):
            raise PermanentBackendError(f"env: {key!r} is not a valid environment variable name")
    # What the device plugin answers is left out (a user's value cannot stand in for it); a remote
    # share has no device plugin, so its own variables (make_pod_spec put them last) stay.
    dropped = SHARE_ENV_NAMES - REMOTE_ENV_NAMES if spec.remote else SHARE_ENV_NAMES
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "env": [{"name": k, "value": v} for k, v in spec.env if k not in dropped],
    }
    if spec.command:
        container["command"] = list(spec.command)
    app_port = dict(spec.env).get(APP_PORT_ENV)
    if app_port and app_port.isdigit():  # the app the portal proxies to (deploy/: portal-connect NetworkPolicy)
        container["ports"] = [{"name": APP_PORT_NAME, "containerPort": int(app_port), "protocol": "TCP"}]
        labels[APP_LABEL] = dict(spec.env).get("TESSERA_APP", "port") or "port"
    pod_spec: dict[str, Any] = {
        "nodeName": spec.node,
        # Never picked up by another scheduler, and recognisable as ours.
        "schedulerName": SCHEDULER_NAME,
        # A batch job runs once; an interactive session comes back if its process dies.
        "restartPolicy": "Never" if spec.kind == "batch" else "Always",
        "terminationGracePeriodSeconds": GRACE_S,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
    }
    if spec.remote:
        if not client_image.strip():
            raise PermanentBackendError("remote shares need the image holding the client libraries "
                                        "(TESSERA_REMOTE_CLIENT_IMAGE)")
        container["volumeMounts"] = [{"name": CLIENT_VOLUME, "mountPath": REMOTE_CLIENT_DIR, "readOnly": True}]
        pod_spec["initContainers"] = [client_libraries_container(client_image)]
        pod_spec["volumes"] = [{"name": CLIENT_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}]
    else:
        container["resources"] = {"limits": {SHARE_RESOURCE: "1"}}
        if runtime_class:
            pod_spec["runtimeClassName"] = runtime_class
        if tolerate_gpu_taint:
            pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": dict(spec.annotations),
        },
        "spec": pod_spec,
    }


def client_libraries_container(image: str) -> dict[str, Any]:
    """The init container that puts the remote client libraries (libcuda.so.1, libcudart.so.13;
    preload/remote) where the workload loads them: a copy from the agent image into the pod's own
    emptyDir, so nothing of the node is mounted. Unprivileged, as PodSecurity `restricted` asks."""
    return {
        "name": CLIENT_INIT_NAME,
        "image": image,
        # -R -P: the libcuda.so link stays a link; the emptyDir is writable by any user
        "command": ["cp", "-RP", f"{CLIENT_IMAGE_DIR}/.", REMOTE_CLIENT_DIR],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": CLIENT_IMAGE_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": CLIENT_VOLUME, "mountPath": REMOTE_CLIENT_DIR}],
    }


def binding_manifest(namespace: str, name: str, node: str,
                     annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Binding of a pod to a node. The API server copies a Binding's annotations onto the pod
    in the same write that sets its node (pkg/registry/core/pod/storage: setPodHostAndAnnotations)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def event_name(pod_name: str, reason: str, message: str) -> str:
    """One Event per pod and message: the same refusal again is the same object (409, dropped)."""
    digest = hashlib.sha256(f"{reason}\0{message}".encode()).hexdigest()[:16]
    return f"{pod_name}.tessera.{digest}"


def event_manifest(*, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str,
                   event_type: str = "Warning", now: datetime | None = None) -> dict[str, Any]:
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(pod_name, reason, message), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod_name,
                           "uid": pod_uid},
        "reason": reason,
        "message": message[:1024],  # the API server refuses longer messages
        "type": event_type,
        "source": {"component": SCHEDULER_NAME},
        "reportingComponent": SCHEDULER_NAME,
        "reportingInstance": SCHEDULER_NAME,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _phase(value: Any) -> Phase:
    try:
        return Phase(value or "Pending")
    except ValueError:
        return Phase.UNKNOWN


def _why(status: Mapping[str, Any]) -> tuple[str, str]:
    """The most telling (reason, message): the pod's own (Evicted), else a container's (OOMKilled)."""
    if status.get("reason"):
        return str(status["reason"]), str(status.get("message") or "")
    for cs in status.get("containerStatuses") or ():
        state = cs.get("state") or {}
        for key in ("terminated", "waiting"):
            inner = state.get(key) or {}
            if inner.get("reason"):
                return str(inner["reason"]), str(inner.get("message") or "")
    return "", ""


def pod_status(obj: Mapping[str, Any]) -> PodStatus:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    reason, message = _why(status)
    external = labels.get(MANAGED_BY_LABEL) != MANAGED_BY
    return PodStatus(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        node=spec.get("nodeName") or None,
        phase=_phase(status.get("phase")),
        reservation_id=labels.get(RESERVATION_LABEL) or (_placed_reservation(meta) if external else None),
        reason=reason,
        message=message,
        deleting=bool(meta.get("deletionTimestamp")),
        external=external,
    )


def _placed_reservation(meta: Mapping[str, Any]) -> str | None:
    """The reservation of a kubectl pod the webhook marked (`RESERVATION_LABEL` present, empty) and
    that was bound with its placement annotation; None while it waits."""
    try:
        return parse_placement(meta.get("annotations")).reservation
    except PlacementError:
        return None


def node_condition(obj: Mapping[str, Any]) -> NodeCondition:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    address = node_address(status.get("addresses") or ())
    for cond in status.get("conditions") or ():
        if cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
            return NodeCondition(meta.get("name", ""), ready, "" if ready else str(cond.get("reason") or ""), address)
    return NodeCondition(meta.get("name", ""), False, "NoReadyCondition", address)


def node_address(addresses: Sequence[Mapping[str, Any]]) -> str:
    """The node's first InternalIP: what pods on other nodes reach it by (the kubelet's own
    address, routable inside the cluster on every network plugin), unlike its name, which the
    cluster's DNS does not resolve. "" when it reports none or a value that is not an IP."""
    for item in addresses:
        if item.get("type") == "InternalIP":
            try:
                return str(ipaddress.ip_address(str(item.get("address") or "")))
            except ValueError:
                continue
    return ""


def _unix(stamp: Any) -> float:
    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def external_pod(obj: Mapping[str, Any]) -> ExternalPod:
    meta = obj.get("metadata") or {}
    containers = (obj.get("spec") or {}).get("containers") or [{}]
    return ExternalPod(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        image=str(containers[0].get("image") or ""),
        created_at=_unix(meta.get("creationTimestamp")),
    )


DEFAULT_SCHEDULER_NAMES = (SCHEDULER_NAME, "kubeshare-scheduler")


def scheduler_names(value: Sequence[str] | str) -> tuple[str, ...]:
    """The scheduler names Tessera answers to, from a list or "a,b" (empty: the defaults, which take
    KubeShare 2.0 manifests, `schedulerName: kubeshare-scheduler`, as they are)."""
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if n.strip()]
    for name in names:
        check_name("scheduler name", name)
    return tuple(dict.fromkeys(names)) or DEFAULT_SCHEDULER_NAMES


def is_pending_external(obj: Mapping[str, Any], names: Sequence[str] = DEFAULT_SCHEDULER_NAMES) -> bool:
    """A user's pod that asked for our scheduler and has no node yet (not one of ours, not leaving)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return (spec.get("schedulerName") in names and not spec.get("nodeName")
            and not meta.get("deletionTimestamp")
            and (meta.get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY
            and (obj.get("status") or {}).get("phase", "Pending") == "Pending")
