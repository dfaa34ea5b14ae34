"""Filter plugins: each refuses GPU slots for one rule and says why.

A filter returns a boolean (nodes x GPU slots) array, True where it refuses, or None when it
refuses nothing (the fast path for requests and clusters without labels). `feasible` runs them in a
fixed order; `explain` counts, per rule, the GPUs that rule was first to refuse.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .model import MILLI, Reason, ReasonCode, Request
from .state import ClusterState


class Filter(Protocol):
    code: ReasonCode

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None: ...

    def message(self, req: Request, count: int) -> str: ...


class NodeReady:
    code = ReasonCode.NODE_NOT_READY

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if state.ready.all():
            return None
        return np.broadcast_to(~state.ready[:, None], state.free.shape)

    def message(self, req: Request, count: int) -> str:
        return f"{count} GPU(s) are on nodes that are draining or lost"


class NodeCpu:
    code = ReasonCode.NODE_CPU

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if req.cpu_milli <= 0:
            return None
        return np.broadcast_to((state.cpu_free < req.cpu_milli)[:, None], state.free.shape)

    def message(self, req: Request, count: int) -> str:
        return f"{count} GPU(s) are on nodes with less than {req.cpu_milli}m CPU left"


class NodeMemory:
    code = ReasonCode.NODE_MEMORY

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if req.memory_mib <= 0:
            return None
        return np.broadcast_to((state.node_mem_free < req.memory_mib)[:, None], state.free.shape)

    def message(self, req: Request, count: int) -> str:
        return f"{count} GPU(s) are on nodes with less than {req.memory_mib} MiB of memory left"


class GpuModel:
    code = ReasonCode.MODEL

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if req.gpu_model is None:
            return None
        return ~state.model_mask(req.gpu_model)

    def message(self, req: Request, count: int) -> str:
        wanted = "|".join(sorted(req.gpu_model or ()))
        return f"{count} GPU(s) are not of model {wanted}"


class Exclusion:
    """A GPU whose shares carry exclusion label X takes only X; unlabelled shares take only unlabelled."""

    code = ReasonCode.EXCLUSION

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if req.exclusion:
            # Only empty GPUs, or GPUs whose every share carries exactly this exclusion set.
            return state.valid & (state.free < MILLI) & ~state.holding_exactly(req.exclusion)
        if not state.has_labels:
            return None
        return state.exclusion_labelled()

    def message(self, req: Request, count: int) -> str:
        mine = ",".join(sorted(req.exclusion)) or "none"
        return f"{count} GPU(s) hold shares of another exclusion group (this request: {mine})"


class AntiAffinity:
    code = ReasonCode.ANTI_AFFINITY

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if not req.anti_affinity or not state.has_labels:
            return None
        return state.holding_label(state.anti_affinity_at, req.anti_affinity)

    def message(self, req: Request, count: int) -> str:
        return f"{count} GPU(s) already hold a share with anti-affinity {','.join(sorted(req.anti_affinity))}"


class Affinity:
    """Where some GPU already holds the affinity label, the request goes there and nowhere else."""

    code = ReasonCode.AFFINITY

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if not req.affinity or not state.has_labels:
            return None
        if not any(label in state.affinity_at for label in req.affinity):
            return None
        return ~state.holding_label(state.affinity_at, req.affinity)

    def message(self, req: Request, count: int) -> str:
        return f"{count} GPU(s) do not hold affinity group {','.join(sorted(req.affinity))}"


class GpuMemory:
    code = ReasonCode.MEMORY

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        if req.gpu_memory_mib <= 0:
            return None
        return state.mem_free < req.gpu_memory_mib

    def message(self, req: Request, count: int) -> str:
        return f"{count} GPU(s) have less than {req.gpu_memory_mib} MiB of GPU memory free"


class Compute:
    code = ReasonCode.COMPUTE

    def refuse(self, state: ClusterState, req: Request) -> np.ndarray | None:
        return state.free < (MILLI if req.whole else req.milli)

    def message(self, req: Request, count: int) -> str:
        if req.whole:
            return f"{count} GPU(s) are not fully free"
        return f"{count} GPU(s) have less than {req.gpu_request:g} of compute free"


FILTERS: tuple[Filter, ...] = (
    NodeReady(),
    NodeCpu(),
    NodeMemory(),
    GpuModel(),
    Exclusion(),
    AntiAffinity(),
    Affinity(),
    GpuMemory(),
    Compute(),
)


def only_compute_per_gpu(state: ClusterState, req: Request) -> bool:
    """True when no per-GPU rule but compute (and the model, on one-model nodes) can refuse a slot.

    Then a GPU's fitness is its free compute alone, which scorers may cache per node.
    """
    return not state.has_labels and not req.exclusion and req.gpu_memory_mib <= 0 and state.homogeneous


LABEL_FILTERS = tuple(f for f in FILTERS if isinstance(f, Exclusion | AntiAffinity | Affinity))


def feasible(state: ClusterState, req: Request) -> np.ndarray:
    """GPU slots that can take one GPU's worth of the request (nodes x slots)."""
    if req.gpu_count == 0:
        return feasible_by_filters(state, req)
    # Fast path, same answer as the filters below: node rules, model, GPU memory, compute (and the
    # label filters themselves, when a share or the request has labels).
    labelled = state.has_labels or req.exclusion
    if not labelled:
        node_ok = state.ready & (state.cpu_free >= req.cpu_milli) & (state.node_mem_free >= req.memory_mib)
    else:  # as NodeCpu and NodeMemory refuse: only for a request that asks for some
        node_ok = state.ready.copy()
        if req.cpu_milli > 0:
            node_ok &= state.cpu_free >= req.cpu_milli
        if req.memory_mib > 0:
            node_ok &= state.node_mem_free >= req.memory_mib
    ok = state.free >= (MILLI if req.whole else req.milli)  # padded slots hold 0: never fit
    if req.gpu_memory_mib > 0:
        ok &= state.mem_free >= req.gpu_memory_mib
    if req.gpu_model is not None:
        ok &= state.model_mask(req.gpu_model)
    ok &= node_ok[:, None]
    if labelled:
        ok &= state.valid
        for f in LABEL_FILTERS:
            refused = f.refuse(state, req)
            if refused is not None:
                ok &= ~refused
    return ok


def feasible_by_filters(state: ClusterState, req: Request) -> np.ndarray:
    """`feasible` through every filter plugin in turn (the reference for the fast path)."""
    ok = state.valid.copy()
    if req.gpu_count == 0:  # CPU only: every valid node row, GPU columns irrelevant
        ok = np.ones(state.free.shape, dtype=bool)
        for f in (NodeReady(), NodeCpu(), NodeMemory()):
            refused = f.refuse(state, req)
            if refused is not None:
                ok &= ~refused
        return ok
    for f in FILTERS:
        refused = f.refuse(state, req)
        if refused is not None:
            ok &= ~refused
    return ok


def fits_on(state: ClusterState, req: Request, node: int, slots: tuple[int, ...]) -> bool:
    """Whether every one of `slots` on `node` can take one GPU's worth of the request now."""
    ok = feasible(state, req)
    return all(ok[node, j] for j in slots)


def nodes_with_room(ok: np.ndarray, req: Request) -> np.ndarray:
    """Nodes where the request as a whole fits: enough feasible GPUs on one node."""
    if req.gpu_count == 0:
        return ok[:, 0] if ok.shape[1] else np.ones(ok.shape[0], dtype=bool)
    if req.gpu_count == 1:
        return ok.any(axis=1)
    return ok.sum(axis=1) >= req.gpu_count


def explain(state: ClusterState, req: Request) -> list[Reason]:
    """Why GPUs were refused, counted per rule in filter order; NO_FIT/WHOLE_GPU when none is left."""
    ok = state.valid.copy()
    reasons: list[Reason] = []
    for f in FILTERS:
        refused = f.refuse(state, req)
        if refused is None:
            continue
        newly = ok & refused
        count = int(newly.sum())
        if count:
            reasons.append(Reason(f.code, f.message(req, count), count))
        ok &= ~refused
    room = nodes_with_room(ok, req)
    if not room.any():
        if req.gpu_count > 1 and ok.any():
            most = int(ok.sum(axis=1).max())
            reasons.append(
                Reason(
                    ReasonCode.WHOLE_GPU,
                    f"no node has {req.gpu_count} GPUs that fit at once (at most {most})",
                    int(ok.any(axis=1).sum()),
                )
            )
        reasons.append(Reason(ReasonCode.NO_FIT, "no GPU in the cluster can take this request now", 0))
    return reasons
