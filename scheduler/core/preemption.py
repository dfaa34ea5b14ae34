"""PostFilter: for a guarantee request that fits nowhere, the fewest lower-priority shares to evict.

Victims always have strictly lower priority than the request, and another team's work is a victim
only when it is opportunistic (priority 0): a team's priorities order its own work, they give no
claim over another team's guaranteed shares (see may_evict). Candidates are ranked by number of
victims, then by the highest victim priority (lowest first), then by node order; each candidate is
checked by actually releasing its victims and running the filters again, and put back if it fails.
"""

from __future__ import annotations

from collections.abc import Callable

from .engine import Choice
from .filters import feasible
from .model import MILLI, Request, Share
from .state import ClusterState, Holding

# Whether a request may evict a share; how early a holding goes (lower first, and an option's cost).
MayEvict = Callable[[Share, Request], bool]
Rank = Callable[[Holding], tuple]


def may_evict(share, req: Request) -> bool:
    """Whether `req` may preempt `share`: within a team by priority; across teams only
    opportunistic (priority-0) work, so no team can take another's guaranteed share by priority."""
    if share.priority >= req.priority:
        return False
    return share.team == req.team or share.priority == 0


def _by_priority(p: Holding) -> tuple:
    return (p.share.priority,)


def _slot_victims(
    state: ClusterState, req: Request, node: int, slot: int, by_slot: dict, may_evict: MayEvict, rank: Rank
) -> list[Holding] | None:
    """Victims on one slot, first by `rank` (lowest priority first by default), that make room for
    one GPU's worth of `req`."""
    shares = by_slot.get((node, slot), [])
    if req.whole and not all(may_evict(p.share, req) for p in shares):
        return None
    need = MILLI if req.whole else req.milli
    free, mem = int(state.free[node, slot]), int(state.mem_free[node, slot])
    # Shares that clash on labels must go whatever their size.
    clash = [p for p in shares if _clashes(p, req)]
    if not all(may_evict(p.share, req) for p in clash):
        return None
    chosen = list(clash)
    for p in chosen:
        free, mem = free + p.milli, mem + p.gpu_memory_mib
    rest = sorted(
        (p for p in shares if p not in chosen and may_evict(p.share, req)),
        key=lambda p: (*rank(p), -p.milli),
    )
    for p in rest:
        if free >= need and mem >= req.gpu_memory_mib:
            break
        chosen.append(p)
        free, mem = free + p.milli, mem + p.gpu_memory_mib
    if free >= need and mem >= req.gpu_memory_mib:
        return chosen
    return None


def _clashes(p: Holding, req: Request) -> bool:
    s = p.share
    if req.anti_affinity & s.anti_affinity:
        return True
    return s.exclusion != req.exclusion


def find_preemption(
    state: ClusterState, req: Request, may_evict: MayEvict = may_evict, rank: Rank = _by_priority
) -> tuple[Choice, tuple[str, ...], list[Holding]] | None:
    """Where `req` fits after evicting some shares: the choice, the victims, and their holdings,
    already released from `state` (restore them to undo). Options are ranked by number of victims,
    then by the worst victim's rank, then by node order."""
    if req.gpu_count == 0:
        return None
    by_slot: dict[tuple[int, int], list[Holding]] = {}
    for p in state.placed.values():
        if p.share.reservation_id in state.reserved_now:
            continue  # decisions of this cycle are not running yet: never victims
        for j in p.gpus:
            by_slot.setdefault((p.node, j), []).append(p)
    allowed = [m for m in range(len(state.models))]
    if req.gpu_model is not None:
        allowed = [state.model_id[m] for m in req.gpu_model if m in state.model_id]
    options: list[tuple[tuple[int, int, int], int, tuple[int, ...], tuple[str, ...]]] = []
    for node in range(len(state.node_names)):
        if not state.ready[node]:
            continue
        per_slot = []
        for slot in range(int(state.gpu_count[node])):
            if int(state.gpu_model[node, slot]) not in allowed:
                continue
            if req.gpu_memory_mib > state.mem_total[node, slot]:
                continue
            victims = _slot_victims(state, req, node, slot, by_slot, may_evict, rank)
            if victims is not None:
                top = max((rank(p) for p in victims), default=())
                per_slot.append((len(victims), top, slot, victims))
        if len(per_slot) < req.gpu_count:
            continue
        per_slot.sort(key=lambda x: x[:3])
        picked = per_slot[: req.gpu_count]
        ids = tuple(sorted({p.share.reservation_id for *_, vs in picked for p in vs}))
        if not ids:
            continue  # fits without eviction: the filters refused it for another reason
        top = max(rank(state.placed[i]) for i in ids)
        options.append(((len(ids), top, int(state.tie_rank[node])), node, tuple(x[2] for x in picked), ids))
    for _, node, slots, ids in sorted(options):
        released = [state.release(i) for i in ids]
        ok = feasible(state, req)
        if all(ok[node, j] for j in slots):
            return Choice(node, tuple(sorted(slots)), 0.0), ids, released
        for rec in released:
            state.restore(rec)
    return None
