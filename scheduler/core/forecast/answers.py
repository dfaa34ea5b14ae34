"""The forecast's answers: an Estimate per request, with its code and the reason in the user's words,
and the checks that answer a request before the walk (never here, or never within the known ends)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..model import Request
from ..state import ClusterState

NOW = "now"
AFTER_ENDS = "after_ends"
NO_READY_GPU = "no_ready_gpu"
UNKNOWN_ENDS = "unknown_ends"
QUOTA = "quota"
POD_GROUP = "pod_group"
BEHIND = "behind"
EVENT_BUDGET = "event_budget"
INVALID = "invalid"
ARRIVALS = "arrivals"


@dataclass(frozen=True)
class Estimate:
    """When a waiting request is expected to start (seconds, the caller's clock), or None, and why."""

    start: float | None
    reason: str
    code: str = ""
    withheld: float | None = None  # where the start is withheld (ARRIVALS): the one the walk found


def models_text(req: Request) -> str:
    """'of model A100', 'of model V100M16|V100M32', 'of any model'."""
    return f"of model {'|'.join(sorted(req.gpu_model))}" if req.gpu_model else "of any model"


def names(rids: list[str]) -> str:
    return ", ".join(rids) if len(rids) <= 3 else f"{len(rids)} reservations"


def behind(limit: int) -> Estimate:
    return Estimate(None, f"no estimate: more than {limit} requests wait ahead of it", BEHIND)


def capable(state: ClusterState, req: Request, ready_nodes: np.ndarray | None = None) -> tuple[int, str]:
    """Ready GPUs that could take one GPU's worth of `req` if nothing ran on them (0 with the reason
    when no ready node could ever take the whole request). `ready_nodes`: the nodes that take work
    at some time of the forecast (default: those ready now)."""
    of = models_text(req)
    nodes_ok = state.ready if ready_nodes is None else ready_nodes
    if req.gpu_count == 0:
        return (int(nodes_ok.sum()), "") if nodes_ok.any() else (0, "no estimate: no node is ready")
    of_model = state.valid & (state.model_mask(req.gpu_model) if req.gpu_model is not None else True)
    if not of_model.any():
        return 0, f"no estimate: the cluster has no GPU {of}"
    ready = of_model & nodes_ok[:, None]
    if not ready.any():
        return 0, f"no estimate: no ready GPU {of}: all {int(of_model.sum())} are on nodes that are draining or lost"
    big = ready & (state.mem_total >= req.gpu_memory_mib)
    if not big.any():
        return 0, f"no estimate: no ready GPU {of} has {req.gpu_memory_mib} MiB of memory"
    if not (big.sum(axis=1) >= req.gpu_count).any():
        most = int(big.sum(axis=1).max())
        return 0, f"no estimate: no ready node has {req.gpu_count} GPUs {of} (at most {most} on one node)"
    return int(big.sum()), ""


def room_at_last(state: ClusterState, ending: Iterable[str]) -> tuple[np.ndarray, ...]:
    """GPU compute and memory free per slot, CPU and memory free per node, once all of `ending`
    (the holders with a known end) have ended."""
    free, mem = state.free.copy(), state.mem_free.copy()
    cpu, node_mem = state.cpu_free.copy(), state.node_mem_free.copy()
    for rid in ending:
        rec = state.placed.get(rid)
        if rec is not None:
            for j in rec.gpus:
                free[rec.node, j] += rec.milli
                mem[rec.node, j] += rec.gpu_memory_mib
            cpu[rec.node] += rec.cpu_milli
            node_mem[rec.node] += rec.node_memory_mib
    return free, mem, cpu, node_mem


class Evictable:
    """Compute held per GPU slot by shares a guarantee request could evict: priority-0 ones (any
    team's) and, per team, its own with a priority."""

    def __init__(self, state: ClusterState) -> None:
        self.zero = np.zeros_like(state.free)
        self.teams: dict[str, np.ndarray] = {}
        for rec in state.placed.values():
            target = self.zero if rec.share.priority == 0 else self.teams.setdefault(
                rec.share.team, np.zeros_like(state.free))
            for j in rec.gpus:
                target[rec.node, j] += rec.milli

    def of(self, req: Request) -> np.ndarray | None:
        """What `req` could evict (None: nothing, it has no priority)."""
        if req.priority <= 0 or req.gpu_count == 0:
            return None
        own = self.teams.get(req.team)
        return self.zero if own is None else self.zero + own


def fits_in(state: ClusterState, room: tuple[np.ndarray, ...], need: tuple[int, int, int, int, int],
            req: Request, evictable: np.ndarray | None, ready_nodes: np.ndarray | None = None) -> bool:
    """Whether a request that needs `need` (like `req`) fits somewhere in `room` (node rules, model,
    memory, compute; not labels), with `evictable` compute added (what it may preempt), on the
    nodes `ready_nodes` (default: those ready now)."""
    milli, count, gpu_mem, cpu_need, mem_need = need
    free, mem_free, cpu, node_mem = room
    if evictable is not None:  # the GPU memory evictions free is not counted: that test is skipped
        free, gpu_mem = free + evictable, 0
    node_ok = (state.ready if ready_nodes is None else ready_nodes) & (cpu >= cpu_need) & (node_mem >= mem_need)
    if count == 0:
        return bool(node_ok.any())
    ok = (free >= milli) & node_ok[:, None]
    if gpu_mem > 0:
        ok &= mem_free >= gpu_mem
    if req.gpu_model is not None:
        ok &= state.model_mask(req.gpu_model)
    return bool((ok.sum(axis=1) >= count).any())
