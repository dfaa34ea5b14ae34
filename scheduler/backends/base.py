"""The contract between the placement cycle and a cluster: plain frozen data in and out.

The portal (`portal/placement`) decides; a backend carries the decision out on a cluster and reports
what the cluster does. Backends know nothing of Django or the database: they receive a `PodSpec`
and answer `PodStatus`, `ClusterEvent` and `ExternalPod` values. Implementations:
`scheduler.backends.local.LocalBackend` (simulated pods, quickstart and tests) and
`scheduler.backends.kubernetes` (the official client).

Pods for portal reservations
----------------------------
- `bind(spec) -> PodStatus`: create the pod, or adopt it when a pod of that name already exists
  and carries the same reservation label (a retried task never makes two). A pod of that name for
  another reservation raises `PodConflict`. Raises `TransientBackendError` for anything worth
  retrying (HTTP 5xx, 429, timeouts, connection refused, 409 on a racing create that a re-read
  does not explain, and the 403s that pass: a fresh namespace's ServiceAccount not there yet, a full
  ResourceQuota) and `PermanentBackendError` when retrying cannot help (422 invalid manifest, a
  missing RuntimeClass, PodSecurity, RBAC, the node does not exist), its message saying what the
  operator must fix: the portal then fails the reservation with it.
- `unbind(ref, grace_s, reason) -> bool`: delete the pod gracefully; True if this call deleted it,
  False if it was already gone or terminating (idempotent, never raises for a missing pod; a pod
  already terminating keeps the reason it was first deleted for).
- `list_pods() -> list[PodStatus]`: every pod carrying `RESERVATION_LABEL`: the ones it created
  and the external pods it bound (kubectl path, `external=True`); reconcile compares these with
  the database. On Kubernetes the webhook marks kubectl pods with an empty `RESERVATION_LABEL` at
  creation: such a pod's reservation comes from its placement annotation once bound, and is None
  while it waits (the user's request itself, never an orphan).
- `list_nodes() -> list[NodeCondition]`: readiness of each cluster node (reconcile notices nodes
  that went NotReady while no watch was running).
- `poll(timeout_s) -> list[ClusterEvent]`: block at most `timeout_s` for what happened since the
  last call: `PodEvent` (phase changed, or `deleted=True` when the pod is gone — deleted from
  outside or after we unbound it) and `NodeEvent` (ready or not). A backend that lost its place in
  the stream (watch expired, 410 Gone) returns what it can and relies on the next reconcile; it
  never invents events. Events may repeat: consumers are idempotent.

Pod naming and linking: `pod_name(reservation_id, attempt)` = ``tessera-r<id>-<attempt>``;
`attempt` counts the placements of that reservation (a requeued one gets a new name, so the old
pod still terminating never collides). Labels: `RESERVATION_LABEL` (the reservation id),
`TEAM_LABEL`, `MANAGED_BY_LABEL`. Annotation `PLACEMENT_ANNOTATION` holds the placement
(`placement_annotation`, in the format wire/pod_placement.py defines: {"reservation": "12", "gpus":
["GPU-..."], "request": 0.25, "limit": 0.5, "memory_mib": 8192, "priority": "high"}); the device
plugin of the kubectl path reads the same annotation. `env` holds what the container needs:
NVIDIA_VISIBLE_DEVICES (the GPU UUIDs, comma-separated), LD_PRELOAD (`PRELOAD_PATH`, mounted read-only from the node's
`PRELOAD_HOST_DIR`), TESSERA_GPU_REQUEST, TESSERA_GPU_LIMIT, TESSERA_GPU_MEMORY_LIMIT (``<n>Mi``),
TESSERA_PRIORITY (high|low), TESSERA_SHARE_ID (the reservation id), TESSERA_BROKER_SOCKET
(`BROKER_SOCKET`, its directory mounted from the node's `BROKER_HOST_DIR`). On Kubernetes the pod
spec carries none of these: the device plugin's Allocate answers them from the placement annotation
(the same values), so the spec names no host path.

Pods created with kubectl (KubeShare 2.0 labels, `schedulerName: tessera`)
--------------------------------------------------------------------------
- `list_pending_external() -> list[ExternalPod]`: pods whose `spec.schedulerName` is one of the
  backend's scheduler names (`SCHEDULER_NAME`; the kubernetes backend also `kubeshare-scheduler`),
  no `nodeName`, not being deleted; with their namespace, uid, labels and annotations (the portal
  turns the `sharedgpu/*` labels into a reservation and validates them).
- `bind_external(pod, node, labels, annotations)`: POST the Binding subresource carrying the
  annotations (`external_binding` gives them: the placement the device plugin reads; the API
  server puts a Binding's annotations on the pod with its node); a pod the webhook did not mark
  gets its labels and annotations patched first. Idempotent: a pod already bound to `node` is
  success; bound elsewhere or gone raises `PodConflict`.
- `bind_external_many(bindings)`: `bind_external` for each `ExternalBinding`, side by side (the
  kubernetes backend: at most `bind_concurrency` pods in flight, each pod's own writes still in their
  order), each outcome in order: None or the `BackendError` it met.
- `reject_external(pod, reason)`: record a Warning Event (reason `FailedScheduling`, message
  `reason`) on the pod, which stays pending. The same message again counts up on that event.

Terminals
---------
- `open_terminal(ref, rows, cols) -> Terminal`: an interactive shell on a TTY of `rows` × `cols`
  inside the running pod, with the pod's environment (Kubernetes: the exec subresource; local: a
  shell on a real PTY in the simulated pod's working directory). Raises `PermanentBackendError`
  when the pod is gone or not running, `TransientBackendError` when the cluster cannot be reached.
  A `Terminal` is used from one reading thread and one writing thread; `close` from either ends
  the shell.

Everything a backend raises derives from `BackendError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from wire import pod_placement
from wire.pod_placement import PLACEMENT_ANNOTATION

SCHEDULER_NAME = "tessera"
MANAGED_BY = "tessera"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
RESERVATION_LABEL = "tessera.io/reservation"
TEAM_LABEL = "tessera.io/team"
REASON_ANNOTATION = "tessera.io/deletion-reason"

PRELOAD_HOST_DIR = "/opt/tessera/lib"
PRELOAD_PATH = "/opt/tessera/lib/libtessera_preload.so"
BROKER_HOST_DIR = "/run/tessera"
BROKER_SOCKET = "/run/tessera/broker.sock"
# Remote shares (preload/remote): where a remote share's pod finds the client libraries (on
# Kubernetes an emptyDir an init container fills from the agent image), the GPU nodes' server port.
REMOTE_CLIENT_DIR = "/opt/tessera/remote/client"
REMOTE_SERVER_PORT = 7470

# Reservations at or above this priority get the broker's "high" class; below it "low".
HIGH_PRIORITY_FROM = 50


class BackendError(Exception):
    """Anything a backend could not do."""


class TransientBackendError(BackendError):
    """Worth retrying later: the API server is unavailable, slow, or raced us."""


class PermanentBackendError(BackendError):
    """Retrying cannot help (invalid manifest, unknown node, forbidden)."""


class PodConflict(PermanentBackendError):
    """A pod of that name exists for another reservation, or an external pod is bound elsewhere."""


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class GpuShare:
    """One GPU of a placement and the share of it the pod holds."""

    uuid: str
    index: int
    gpu_request: float
    gpu_limit: float
    gpu_memory_mib: int


@dataclass(frozen=True)
class PodSpec:
    """Everything needed to run one reservation's pod. Built by `make_pod_spec`."""

    reservation_id: str
    name: str
    namespace: str
    node: str
    team: str
    image: str
    command: tuple[str, ...]
    gpus: tuple[GpuShare, ...]
    priority: int
    kind: str  # "interactive" | "batch"
    env: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    # Local backend only: how long a simulated batch pod runs before it succeeds (None: until deleted).
    simulated_duration_s: float | None = None
    # A remote share (preload/remote): the pod runs on a node without the GPU, with the client
    # libraries instead of a driver; `env` holds the server address and the share token.
    remote: bool = False

    @property
    def ref(self) -> PodRef:
        return PodRef(self.namespace, self.name)

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class PodStatus:
    namespace: str
    name: str
    uid: str
    node: str | None
    phase: Phase
    reservation_id: str | None  # from RESERVATION_LABEL; None for a pod we did not label
    reason: str = ""  # e.g. "OOMKilled", "Error", "Evicted"; "" when none
    message: str = ""
    deleting: bool = False  # deletionTimestamp set
    external: bool = False  # created by a user (kubectl path), bound by us

    @property
    def ref(self) -> PodRef:
        return PodRef(self.namespace, self.name)


@dataclass(frozen=True)
class ExternalBinding:
    """One kubectl pod's binding: `bind_external`'s arguments, for `bind_external_many`."""

    pod: PodRef
    node: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class NodeCondition:
    name: str
    ready: bool
    reason: str = ""
    # The node's address as the cluster reports it (Kubernetes: status.addresses InternalIP), which
    # other nodes' pods reach it by; "" when the cluster does not say (the local backend).
    address: str = ""


@dataclass(frozen=True)
class PodEvent:
    pod: PodStatus
    deleted: bool = False


@dataclass(frozen=True)
class NodeEvent:
    node: NodeCondition


ClusterEvent = PodEvent | NodeEvent


@dataclass(frozen=True)
class ExternalPod:
    """A pod a user created with `schedulerName: tessera` that waits for a node."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    image: str = ""
    created_at: float = 0.0  # unix seconds

    @property
    def ref(self) -> PodRef:
        return PodRef(self.namespace, self.name)


class Terminal(Protocol):
    """A shell in a pod behind a TTY (`Backend.open_terminal`)."""

    # At most `max_bytes` of the shell's output, waiting at most `timeout_s` for some: None when
    # nothing came in that time, b"" when the shell has ended (then every later call says so too).
    def read(self, max_bytes: int, timeout_s: float) -> bytes | None: ...

    def write(self, data: bytes) -> None: ...

    def resize(self, rows: int, cols: int) -> None: ...

    # End the shell and free what it holds; idempotent.
    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    # Whether the cluster itself watches its nodes' health (a kubelet's heartbeat: a dead node turns
    # NotReady in `list_nodes` and its pods fail NodeLost). Where nothing does (the local backend's
    # simulated nodes), the node's agent going silent is the only sign that the node is gone.
    watches_nodes: bool

    def bind(self, spec: PodSpec) -> PodStatus: ...

    # `bind` for many pods, each outcome in order: its status, or the BackendError it met (one
    # failing pod does not stop the others).
    def bind_many(self, specs: Sequence[PodSpec]) -> list[PodStatus | BackendError]: ...

    def unbind(self, ref: PodRef, grace_s: int, reason: str) -> bool: ...

    def list_pods(self) -> list[PodStatus]: ...

    def list_nodes(self) -> list[NodeCondition]: ...

    def poll(self, timeout_s: float) -> list[ClusterEvent]: ...

    def list_pending_external(self) -> list[ExternalPod]: ...

    def bind_external(self, pod: PodRef, node: str, labels: Mapping[str, str],
                      annotations: Mapping[str, str]) -> None: ...

    # `bind_external` for many pods (side by side where the cluster is remote), each outcome in
    # order: None (bound) or the BackendError it met (one failing pod does not stop the others).
    def bind_external_many(self, bindings: Sequence[ExternalBinding]) -> list[BackendError | None]: ...

    def reject_external(self, pod: PodRef, reason: str) -> None: ...

    # The pod's log, its last `tail_lines` lines (timestamped); None when there is no such pod.
    def pod_log(self, ref: PodRef, tail_lines: int = 200) -> str | None: ...

    def open_terminal(self, ref: PodRef, rows: int, cols: int) -> Terminal: ...

    def app_address(self, ref: PodRef, port: int) -> str | None:
        """`host:port` where the portal reaches the pod's app (portal.connect), or None while the
        pod has no address yet or is gone."""
        ...


def pod_name(reservation_id: str | int, attempt: int) -> str:
    return f"tessera-r{reservation_id}-{attempt}"


def broker_priority(priority: int) -> str:
    return "high" if priority >= HIGH_PRIORITY_FROM else "low"


def placement_annotation(reservation_id: str, gpus: tuple[GpuShare, ...], priority: int) -> str:
    """The pod's placement annotation (wire/pod_placement.py: the format the node reads)."""
    first = gpus[0]
    return pod_placement.encode(reservation_id, [g.uuid for g in gpus], first.gpu_request, first.gpu_limit,
                                first.gpu_memory_mib, broker_priority(priority))


def share_env(reservation_id: str, gpus: tuple[GpuShare, ...], priority: int) -> dict[str, str]:
    """The variables the preload library and the NVIDIA runtime read (wire/pod_placement.py), at
    the paths the node's pods mount them."""
    first = gpus[0]
    return pod_placement.share_env(reservation_id, [g.uuid for g in gpus], first.gpu_request, first.gpu_limit,
                                   first.gpu_memory_mib, broker_priority(priority), preload=PRELOAD_PATH,
                                   broker_socket=BROKER_SOCKET)


def remote_share_env(reservation_id: str, server: str, token: str) -> dict[str, str]:
    """A remote share's variables (preload/remote/README.md): the client libraries instead of a
    driver, the GPU node's server and the share token. No GPU is visible here; the share's cap and
    compute time come from the token's claims, enforced on the GPU node."""
    return {
        "LD_LIBRARY_PATH": REMOTE_CLIENT_DIR,
        "TESSERA_REMOTE_SERVER": server,
        "TESSERA_REMOTE_TOKEN": token,
        "TESSERA_SHARE_ID": reservation_id,
    }


def external_binding(reservation_id: str, team: str, gpus: tuple[GpuShare, ...],
                     priority: int) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) to patch onto a kubectl pod before binding it."""
    labels = {RESERVATION_LABEL: reservation_id, TEAM_LABEL: team}
    return labels, {PLACEMENT_ANNOTATION: placement_annotation(reservation_id, gpus, priority)}


def make_pod_spec(*, reservation_id: str, attempt: int, namespace: str, node: str, team: str, image: str,
                  command: tuple[str, ...], gpus: tuple[GpuShare, ...], priority: int, kind: str,
                  extra_env: Mapping[str, str] | None = None,
                  simulated_duration_s: float | None = None,
                  remote_env: Mapping[str, str] | None = None) -> PodSpec:
    """A complete, deterministic spec: the same inputs always give the same pod."""
    if not gpus:
        raise ValueError("gpus: a pod needs at least one GPU share")
    if attempt < 1:
        raise ValueError("attempt: counts from 1")
    env = dict(extra_env or {})
    # ours win: a user cannot lift the cap (a remote share's is in its token)
    env.update(remote_env if remote_env is not None else share_env(reservation_id, gpus, priority))
    labels = {RESERVATION_LABEL: reservation_id, TEAM_LABEL: team, MANAGED_BY_LABEL: MANAGED_BY}
    annotations = {PLACEMENT_ANNOTATION: placement_annotation(reservation_id, gpus, priority)}
    return PodSpec(
        reservation_id=reservation_id, name=pod_name(reservation_id, attempt), namespace=namespace, node=node,
        team=team, image=image, command=tuple(command), gpus=tuple(gpus), priority=priority, kind=kind,
        env=tuple(sorted(env.items())), labels=tuple(sorted(labels.items())),
        annotations=tuple(sorted(annotations.items())), simulated_duration_s=simulated_duration_s,
        remote=remote_env is not None,
    )
