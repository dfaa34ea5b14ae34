"""Score plugins (placement policies). Higher is better; ties go to the node first in `tie_rank`.

A scorer sees the feasible GPU slots (`ok`, nodes x slots) and the nodes where the whole request
fits (`room`), and returns a score per node plus, for one-GPU requests, the slot it would take
(-1 lets the topology rule pick whole GPUs).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .model import MILLI, Request
from .state import UNTRACKED, ClusterState

# Normalisers of the reference simulator's BestFit (largest node: 128 cores, 8 GPUs).
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8 * MILLI


class Scorer(Protocol):
    name: str

    def score(
        self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...


def pick_slot(gpu_scores: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the best score over feasible slots, and the lowest slot that has it."""
    masked = np.where(ok, gpu_scores, -np.inf)
    best = masked.max(axis=1)
    slot = np.argmax(masked == best[:, None], axis=1)
    return best, np.where(np.isfinite(best), slot, -1)


def best_fit_slot(state: ClusterState, req: Request, ok: np.ndarray) -> np.ndarray:
    """The feasible slot with the least compute left (lowest index on ties)."""
    if req.gpu_count != 1 or req.whole:
        return np.full(ok.shape[0], -1)
    return pick_slot(-state.free.astype(np.float64), ok)[1]


def pod_cpu(req: Request) -> int:
    """kube-scheduler scores a pod without a CPU request as if it asked for 100m."""
    return req.cpu_milli if req.cpu_milli > 0 else 100


def _cpu_left(state: ClusterState) -> np.ndarray:
    return np.where(state.cpu_free == UNTRACKED, MAX_SPEC_CPU, state.cpu_free).astype(np.float64)


class RandomScorer:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        node = self.rng.random(ok.shape[0])
        slot = pick_slot(self.rng.random(ok.shape), ok)[1] if req.gpu_count == 1 and not req.whole else None
        return node, slot if slot is not None else np.full(ok.shape[0], -1)


class BestFitScorer:
    """The node left with the least CPU and GPU (weighted half each), min-max normalised to 0..100."""

    name = "best-fit"

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        gpu_left = state.free.sum(axis=1) - req.total_milli
        left = (_cpu_left(state) - pod_cpu(req)) / MAX_SPEC_CPU * 0.5 + gpu_left / MAX_SPEC_GPU * 0.5
        raw = ((1.0 - left) * 100).astype(np.int64)  # the reference truncates to integers
        return _normalize(raw, room), best_fit_slot(state, req, ok)


class PackingScorer:
    """Fill GPUs and nodes already in use before touching empty ones."""

    name = "packing"

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        used = (state.valid.sum(axis=1) * MILLI - state.free.sum(axis=1)).astype(np.float64)
        busy_gpus = (state.valid & (state.free < MILLI)).sum(axis=1)
        return used + busy_gpus * 10.0, best_fit_slot(state, req, ok)


class SpreadScorer:
    """Least-loaded node first, and the emptiest GPU on it (less interference, more fragments)."""

    name = "spread"

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        cap = np.maximum(state.valid.sum(axis=1), 1) * MILLI
        node = state.free.sum(axis=1) / cap
        slot = pick_slot(state.free.astype(np.float64), ok)[1] if req.gpu_count == 1 else None
        return node, slot if slot is not None else np.full(ok.shape[0], -1)


class DotProductScorer:
    """Smallest dot product of the node's normalised free (CPU, GPU) vector with the request's."""

    name = "dot-product"

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        free_cpu = _cpu_left(state) / MAX_SPEC_CPU
        free_gpu = state.free.sum(axis=1) / MAX_SPEC_GPU
        dot = free_cpu * (pod_cpu(req) / MAX_SPEC_CPU) + free_gpu * (req.total_milli / MAX_SPEC_GPU)
        return -dot, best_fit_slot(state, req, ok)


def _normalize(raw: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Min-max to 0..100 over the nodes that fit, in integers, as kube-scheduler's NormalizeScore."""
    if not room.any():
        return raw
    lo, hi = raw[room].min(), raw[room].max()
    if hi == lo:
        return np.zeros_like(raw)
    return (raw - lo) * 100 // (hi - lo)
