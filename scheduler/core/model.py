"""The engine's public data: a frozen snapshot in, frozen decisions out.

Compute shares are fractions of one GPU (0 < share <= 1.0) at the edge; inside the engine they are
integer thousandths ("milli") so that sums never drift (0.1 + 0.2 != 0.3 in floats).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .bookings import Booking
    from .fairshare import QuotaTree
    from .state import FleetLayout

MILLI = 1000


def to_milli(share: float) -> int:
    """A share (0..1] as integer thousandths, rounded to the nearest one."""
    return round(share * MILLI)


class NodeStatus(StrEnum):
    READY = "ready"
    DRAINING = "draining"  # keeps what runs, takes nothing new
    LOST = "lost"  # agent silent; nothing is placed there


class ReasonCode(StrEnum):
    """Stable codes for why a request was not placed (or why a GPU was refused)."""

    INVALID = "invalid"
    QUOTA = "quota"
    NODE_NOT_READY = "node_not_ready"
    NODE_CPU = "node_cpu"
    NODE_MEMORY = "node_memory"
    MODEL = "model"
    EXCLUSION = "exclusion"
    AFFINITY = "affinity"
    ANTI_AFFINITY = "anti_affinity"
    MEMORY = "memory"
    COMPUTE = "compute"
    WHOLE_GPU = "whole_gpu"
    NO_FIT = "no_fit"
    GANG_INCOMPLETE = "gang_incomplete"


@dataclass(frozen=True)
class Reason:
    code: ReasonCode
    message: str
    count: int = 0  # how many GPUs (or nodes) this reason refused, where that is meaningful

    def as_dict(self) -> dict[str, object]:
        return {"code": str(self.code), "message": self.message, "count": self.count}


def _labels(value: Iterable[str] | str | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset([value]) if value else frozenset()
    return frozenset(v for v in value if v)


@dataclass(frozen=True)
class Share:
    """A share already placed on a GPU (running or reserved)."""

    reservation_id: str
    gpu_request: float
    gpu_memory_mib: int = 0
    priority: int = 0
    team: str = ""
    affinity: frozenset[str] = frozenset()
    anti_affinity: frozenset[str] = frozenset()
    exclusion: frozenset[str] = frozenset()
    group: str | None = None
    # How it was admitted (fairshare.Admission: guaranteed, borrowed, opportunistic), when it was
    # placed (seconds, the snapshot's clock) and, for a borrowed share being reclaimed, when it goes.
    admission: str = "guaranteed"
    since: float = 0.0
    reclaim_at: float | None = None
    # Held by another scheduler (a kube-scheduler's DRA claim): it counts as used room and in its
    # team's quota, but it is nobody's reservation here, so no rule may evict it (ClusterState.protected).
    external: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.gpu_request <= 1.0:
            raise ValueError(f"share {self.reservation_id}: gpu_request {self.gpu_request} must be in (0, 1]")
        if self.gpu_memory_mib < 0:
            raise ValueError(f"share {self.reservation_id}: gpu_memory_mib must not be negative")
        for name in ("affinity", "anti_affinity", "exclusion"):
            object.__setattr__(self, name, _labels(getattr(self, name)))


@dataclass(frozen=True)
class Gpu:
    uuid: str
    index: int
    model: str
    memory_mib: int
    nvlink_peers: frozenset[int] = frozenset()  # indexes of GPUs on the same node linked by NVLink
    numa_node: int = 0
    shares: tuple[Share, ...] = ()

    def __post_init__(self) -> None:
        if self.memory_mib <= 0:
            raise ValueError(f"gpu {self.uuid}: memory_mib must be positive")
        object.__setattr__(self, "nvlink_peers", frozenset(self.nvlink_peers))
        object.__setattr__(self, "shares", tuple(self.shares))


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    status: NodeStatus = NodeStatus.READY
    cpu_milli_free: int | None = None  # None: not tracked, never a reason to refuse
    memory_mib_free: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "status", NodeStatus(self.status))
        indexes = [g.index for g in self.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"node {self.name}: GPU indexes repeat")


@dataclass(frozen=True)
class PlannedDrain:
    """A node's planned maintenance window (seconds, the snapshot's clock): from `starts_at` the
    node takes no new work (what runs there runs on), from `ends_at` (None: until a person returns
    it) it takes work again. Read by the forecast (`forecast.estimate_starts(drains=...)`); the
    cycle sees a drain through the node's status once the portal applies it."""

    node: str
    starts_at: float
    ends_at: float | None = None

    def __post_init__(self) -> None:
        if self.ends_at is not None and self.ends_at <= self.starts_at:
            raise ValueError(f"planned drain of {self.node}: ends_at must be after starts_at")

    def covers(self, t: float) -> bool:
        return self.starts_at <= t and (self.ends_at is None or t < self.ends_at)


@dataclass(frozen=True)
class TeamUsage:
    """Optional per-team numbers for fair-share ordering (quota itself is enforced by the portal)."""

    quota_gpus: float
    used_gpus: float

    @property
    def ratio(self) -> float:
        return self.used_gpus / self.quota_gpus if self.quota_gpus > 0 else math.inf


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    teams: Mapping[str, TeamUsage] = field(default_factory=dict)
    now: float = 0.0  # seconds, same clock as Request.created_at
    # The fleet laid out once (state.FleetLayout of the nodes without shares), when the caller keeps
    # one: the engine starts from a copy of it instead of laying out every GPU again.
    layout: FleetLayout | None = field(default=None, compare=False, repr=False)
    # Departments, teams and their quotas per GPU model (fairshare.QuotaTree): admission,
    # fair-share order and reclaim. None: no quota policy (everything guaranteed; traces).
    quotas: QuotaTree | None = field(default=None, compare=False, repr=False)
    # team → decayed past use (milli-GPU), added when ordering by fair share (empty: off).
    past_use: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)
    # Booked windows not started yet (bookings.Booking): their room is held ahead of them and
    # placement works around them. Empty: the cycle decides as without bookings.
    bookings: tuple[Booking, ...] = field(default=(), compare=False, repr=False)
    # Waiting request id -> how long it runs once started, where known (its maximum duration, or
    # the learnt run time): backfill before a booked window. Read only when there are bookings.
    durations: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("snapshot: node names repeat")


@dataclass(frozen=True)
class PodGroup:
    """Coscheduling: at least ceil(threshold * headcount) members are placed together or none."""

    name: str
    headcount: int
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.headcount < 1:
            raise ValueError(f"pod group {self.name}: headcount must be >= 1")
        if not 0 < self.threshold <= 1.0:
            raise ValueError(f"pod group {self.name}: threshold must be in (0, 1]")

    @property
    def min_members(self) -> int:
        return max(1, math.ceil(self.threshold * self.headcount - 1e-9))


@dataclass(frozen=True)
class Request:
    """A pending request for GPU share(s). gpu_model: None (any), a model, a set, or 'A|B'."""

    id: str
    team: str = ""
    gpu_request: float = 1.0
    gpu_limit: float | None = None
    gpu_memory_mib: int = 0
    gpu_count: int = 1
    gpu_model: frozenset[str] | str | None = None
    priority: int = 0
    affinity: frozenset[str] = frozenset()
    anti_affinity: frozenset[str] = frozenset()
    exclusion: frozenset[str] = frozenset()
    group: PodGroup | None = None
    created_at: float = 0.0
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        where = f"request {self.id}"
        if self.gpu_count < 0:
            raise ValueError(f"{where}: gpu_count must be >= 0 (0: CPU only, as in traces)")
        if not 0 < self.gpu_request <= 1.0:
            raise ValueError(f"{where}: gpu_request {self.gpu_request} must be in (0, 1]")
        if self.gpu_count > 1 and to_milli(self.gpu_request) != MILLI:
            raise ValueError(
                f"{where}: a request for {self.gpu_count} GPUs takes whole GPUs (gpu_request 1.0)"
            )
        if to_milli(self.gpu_request) < 1:
            raise ValueError(f"{where}: gpu_request below 0.001 of a GPU")
        if self.gpu_limit is not None and not self.gpu_request <= self.gpu_limit <= 1.0:
            raise ValueError(f"{where}: gpu_limit must be between gpu_request and 1.0")
        if not 0 <= self.priority <= 100:
            raise ValueError(f"{where}: priority must be in 0..100")
        for name in ("gpu_memory_mib", "cpu_milli", "memory_mib"):
            if getattr(self, name) < 0:
                raise ValueError(f"{where}: {name} must not be negative")
        model = self.gpu_model
        if isinstance(model, str):
            model = frozenset(m for m in model.split("|") if m)
        elif model is not None:
            model = frozenset(model)
        if model is not None and not model:
            model = None
        object.__setattr__(self, "gpu_model", model)
        for name in ("affinity", "anti_affinity", "exclusion"):
            object.__setattr__(self, name, _labels(getattr(self, name)))

    @property
    def milli(self) -> int:
        return to_milli(self.gpu_request)

    @property
    def whole(self) -> bool:
        """Whole-GPU requests take fully free GPUs."""
        return self.milli == MILLI

    @property
    def total_milli(self) -> int:
        return self.milli * self.gpu_count

    @property
    def has_labels(self) -> bool:
        return bool(self.affinity or self.anti_affinity or self.exclusion)


@dataclass(frozen=True)
class GpuCandidate:
    node: str
    gpu_uuid: str
    gpu_index: int
    model: str
    free_share: float
    free_memory_mib: int
    score: float


@dataclass(frozen=True)
class Placement:
    request_id: str
    node: str
    gpu_uuids: tuple[str, ...]
    gpu_indexes: tuple[int, ...]
    gpu_request: float  # per GPU
    gpu_memory_mib: int  # per GPU
    score: float = 0.0
    group: str | None = None
    admission: str = "guaranteed"  # fairshare.Admission


@dataclass(frozen=True)
class Preemption:
    """Evict `victims` (reservation ids), then bind `placement` in their place."""

    request_id: str
    victims: tuple[str, ...]
    placement: Placement


@dataclass(frozen=True)
class Reclaim:
    """A request within its team's quota waits while borrowed shares are reclaimed for it: each
    victim is preempted at its time in `due` (now + its team's grace, or when it was already
    warned); `reasons` say why it cannot start sooner. `kind` says why the victims go, so that
    their owners can be told: "quota" (the request's team wants back the quota it lent),
    "fair_share" (its team is below its fair share) or "node_hold" (the request needs whole GPUs
    on one node and the victims' node is held for it)."""

    request_id: str
    victims: tuple[str, ...]
    due: Mapping[str, float]
    reasons: tuple[Reason, ...] = ()
    kind: str = "quota"


@dataclass(frozen=True)
class Unschedulable:
    request_id: str
    reasons: tuple[Reason, ...]

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(str(r.code) for r in self.reasons)


@dataclass(frozen=True)
class CycleResult:
    policy: str
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    unschedulable: tuple[Unschedulable, ...] = ()
    reclaims: tuple[Reclaim, ...] = ()
