"""One placement decision: filter -> score -> select (ties by node order) -> which GPUs.

The trace replay calls `choose` per pod; the cycle calls it per request. Same code either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .filters import feasible, nodes_with_room
from .fragmentation import FgdScorer, TypicalPod
from .model import Request
from .scorers import (
    BestFitScorer,
    DotProductScorer,
    PackingScorer,
    RandomScorer,
    Scorer,
    SpreadScorer,
    best_fit_slot,
)
from .state import ClusterState
from .tessera import TesseraScorer
from .topology import pick_gpus

POLICIES = ("random", "best-fit", "packing", "spread", "dot-product", "fgd", "tessera")


def make_scorer(
    policy: str, state: ClusterState, typical: Sequence[TypicalPod] = (), seed: int = 0
) -> Scorer:
    """The scorer for a policy name. FGD and Tessera need the typical workload."""
    if policy == "random":
        return RandomScorer(seed)
    if policy in ("best-fit", "bestfit"):
        return BestFitScorer()
    if policy == "packing":
        return PackingScorer()
    if policy == "spread":
        return SpreadScorer()
    if policy in ("dot-product", "dotprod"):
        return DotProductScorer()
    if policy == "fgd":
        return FgdScorer(state, typical)
    if policy == "tessera":
        return TesseraScorer(state, typical)
    raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")


@dataclass(frozen=True)
class Choice:
    node: int
    slots: tuple[int, ...]
    score: float


def choose(
    state: ClusterState,
    req: Request,
    scorer: Scorer,
    ok: np.ndarray | None = None,
    tier: np.ndarray | None = None,
) -> Choice | None:
    """The best node and GPU slots for `req`, or None when nothing fits.

    `tier` (per node, higher first) is compared before the score: gangs use it to stay close.
    """
    if ok is None:
        ok = feasible(state, req)
    narrow = getattr(scorer, "narrow", None)  # a scorer that prefers some slots (bookings.BookingScorer)
    if narrow is not None:
        ok = narrow(state, req, ok)
    room = nodes_with_room(ok, req)
    if not room.any():
        return None
    scores, slot = scorer.score(state, req, ok, room)
    cand = room
    if tier is not None:
        cand = cand & (tier == tier[cand].max())
    masked = np.where(cand, scores, -np.inf)
    best = masked.max()
    tied = np.flatnonzero(masked == best)
    node = int(tied[0]) if tied.size == 1 else int(tied[np.argmin(state.tie_rank[tied])])
    if req.gpu_count == 0:
        slots: tuple[int, ...] = ()
    elif req.gpu_count == 1 and not req.whole:
        j = int(slot[node])
        if j < 0 or not ok[node, j]:
            j = int(best_fit_slot(state, req, ok)[node])
        slots = (j,)
    else:
        slots = pick_gpus(state, node, ok[node], req.gpu_count)
    return Choice(node, slots, float(best))
