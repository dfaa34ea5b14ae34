"""Tessera's placement engine: pure Python + numpy, no Django, no I/O.

Public interface (stable; the portal's Celery cycle and capacity endpoint use it):

Data in (frozen dataclasses, `scheduler.core.model`):
- `Snapshot(nodes, teams={}, now=0.0)`
- `Node(name, gpus, labels={}, status=NodeStatus.READY|DRAINING|LOST, cpu_milli_free=None,
  memory_mib_free=None)`
  (None: not tracked, never a reason to refuse)
- `Gpu(uuid, index, model, memory_mib, nvlink_peers=frozenset[int], numa_node=0, shares=())`
- `Share(reservation_id, gpu_request, gpu_memory_mib, priority, team, affinity, anti_affinity, exclusion, group)`:
  a share already on a GPU (a multi-GPU reservation appears once per GPU, same reservation_id)
- `TeamUsage(quota_gpus, used_gpus)`: optional, the queue's team order by usage / quota when the
  snapshot has no quota tree (traces)
- `Snapshot.quotas`: a `QuotaTree` of `Unit(name, parent, quotas={bucket: BucketQuota(milli,
  memory_mib, gpus, borrowing=Limits(...), lending=Limits(...), weight)}, team, allow_over_quota,
  reclaim_grace_s)`; with it the cycle admits each request as guaranteed, borrowed or opportunistic
  per GPU model, orders the queue by fair share and reclaims borrowed shares (fairshare.py,
  fairqueue.py; the formula is in ARCHITECTURE.md). `Snapshot.past_use`: team → decayed past use.
- `Snapshot.bookings`: `Booking(id, team, gpu_model, gpu_request, gpu_memory_mib, gpu_count,
  starts_at, ends_at, lead_s)`, booked windows (bookings.py: room held from `lead_s` before the
  start, work in the way warned with `Reclaim(kind="booking")`, a started booking's waiting request
  placed first, a running window nobody's victim); `Snapshot.durations`: waiting request → known
  run time (placement keeps long work off booked GPUs and backfills short work before a window).
  Shares carry `admission`, `since` and `reclaim_at`; placements carry `admission`.
- `PlannedDrain(node, starts_at, ends_at=None)`: a node's maintenance window, for the forecast
  (`forecast.estimate_starts(drains=...)`: the node takes no new work over it).
- `Request(id, team, gpu_request, gpu_limit, gpu_memory_mib, gpu_count, gpu_model, priority,
  affinity, anti_affinity, exclusion, group=PodGroup(name, headcount, threshold), created_at,
  cpu_milli, memory_mib)`; gpu_model: None, "A100", {"V100M16", "V100M32"} or "V100M16|V100M32";
  gpu_count >= 2 needs gpu_request 1.0 (whole GPUs); gpu_count 0 is a CPU-only pod (traces);
  invalid values raise ValueError with the field named.

Entry points:
- `schedule(snapshot, pending, policy="tessera", *, preemption=True, typical=None, seed=0,
  aging_s=300) -> CycleResult(policy, placements, preemptions, unschedulable)`
  - `Placement(request_id, node, gpu_uuids, gpu_indexes, gpu_request, gpu_memory_mib, score, group)`
  - `Preemption(request_id, victims: tuple[reservation_id], placement)`: evict, then bind
  - `Unschedulable(request_id, reasons: tuple[Reason(code, message, count)])`
- `decide(...)` (same arguments): the same decisions one at a time, in queue order, as they are
  made: a tuple of Placements (a request, or a pod group's members together), a Preemption or an
  Unschedulable; a caller can commit the first ones while the rest are computed.
- `Reclaim(request_id, victims, due, reasons)`: a request within its quota waits while borrowed
  victims are warned; each goes at its `due` time (then the next cycle preempts it).
- `judge(snapshot, request, limit=None) -> Judgement(admission, candidates, count, reasons, never)`:
  what the cycle would do with the request alone now (the preview and the capacity API).
- `feasible_gpus(snapshot, request, policy="tessera") -> (list[GpuCandidate], list[Reason])`:
  candidates best first (node, gpu_uuid, gpu_index, model, free_share, free_memory_mib, score).
- `best_gpus(snapshot, request, limit) -> (first `limit` candidates, how many in all, reasons)`: the same
  order, building only the candidates asked for (the capacity preview).
- `POLICIES`: random, best-fit, packing, spread, dot-product, fgd, tessera (the default: FGD's
  fragmentation gradient plus CPU stranding; see `tessera.py` and bench/results/scheduler/).
- `FleetLayout(nodes)`: a fleet laid out once; a snapshot that carries it (`Snapshot.layout`, its
  nodes the layout's own objects or copies with shares and free CPU/memory set) starts from a copy
  of it instead of laying out every GPU again (the portal keeps one per fleet version).
- Lower level, as the trace replay uses it: `ClusterState` (numpy working copy of a snapshot),
  `make_scorer(policy, state, typical)`, `choose(state, request, scorer) -> Choice | None`,
  `state.reserve(request, node, slots)`.

Semantics: shares are fractions of a GPU, summed by request (the limit above it is not reserved);
whole-GPU requests take fully free GPUs of one node (NVLink-linked first, then one NUMA node);
exclusion labels never mix on a GPU; anti-affinity keeps equal labels on different GPUs; affinity
joins the GPU that holds the label; a pod group places at least ceil(threshold x headcount)
members in one cycle or none, close together (node, then rack/zone label); a guarantee request
(priority > 0) that fits nowhere may preempt the fewest strictly-lower-priority shares.

Reason codes (`ReasonCode`, stable strings): invalid, quota, node_not_ready, node_cpu, node_memory,
model, exclusion, affinity, anti_affinity, memory, compute, whole_gpu, no_fit, gang_incomplete.
"""

from .bookings import Booking
from .cycle import Decision, Judgement, best_gpus, decide, feasible_gpus, judge, schedule
from .engine import POLICIES, Choice, choose, make_scorer
from .fairshare import Admission, BucketQuota, Limits, QuotaTree, Unit
from .fragmentation import TypicalPod, typical_pods
from .model import (
    MILLI,
    CycleResult,
    Gpu,
    GpuCandidate,
    Node,
    NodeStatus,
    Placement,
    PlannedDrain,
    PodGroup,
    Preemption,
    Reason,
    ReasonCode,
    Reclaim,
    Request,
    Share,
    Snapshot,
    TeamUsage,
    Unschedulable,
)
from .state import ClusterState, FleetLayout

__all__ = [
    "MILLI",
    "POLICIES",
    "Admission",
    "Booking",
    "BucketQuota",
    "Choice",
    "ClusterState",
    "CycleResult",
    "Decision",
    "FleetLayout",
    "Gpu",
    "GpuCandidate",
    "Judgement",
    "Limits",
    "Node",
    "NodeStatus",
    "Placement",
    "PlannedDrain",
    "PodGroup",
    "Preemption",
    "QuotaTree",
    "Reason",
    "ReasonCode",
    "Reclaim",
    "Request",
    "Share",
    "Snapshot",
    "TeamUsage",
    "TypicalPod",
    "Unit",
    "Unschedulable",
    "best_gpus",
    "choose",
    "decide",
    "feasible_gpus",
    "judge",
    "make_scorer",
    "schedule",
    "typical_pods",
]
