"""PostFilter: for a guarantee request that fits nowhere, the fewest lower-priority shares to evict.

Victims always have strictly lower priority than the request, and another team's work is a victim
only when it is opportunistic (priority 0): a team's priorities order its own work, they give no
claim over another team's guaranteed shares (see may_evict). Candidates are ranked by number of
victims, then by the highest victim priority (lowest first), then by node order; each candidate is
checked by actually releasing its victims and running the filters again, and put back if it fails.
Within a slot, victims that rank equal (and are of equal size) go in the order they were first
placed (`Holding.order`), which a rolled-back candidate does not change.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Iterable, Sequence

import numpy as np

from .engine import Choice
from .filters import fits_on
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


def _may_evict_among(state: ClusterState, req: Request) -> Iterable[Holding]:
    """The shares `may_evict` may allow: the request's team's and those of priority 0."""
    return state.holdings_of(teams=[req.team], priorities=[0]).values()


# Rules whose possible victims the state's indexes give (find_preemption's `among` for them).
_CANDIDATES: dict[MayEvict, Callable[[ClusterState, Request], Iterable[Holding]]] = {may_evict: _may_evict_among}


def priority_order(p: Holding) -> tuple:
    return (p.share.priority,)


def _slot_victims(req: Request, shares: Sequence[Holding], free: int, mem: int, need: int,
                  evictable: Container[str], rank: Rank) -> list[Holding] | None:
    """Victims among `shares` (those on one slot, with `free` compute and `mem` GPU memory left;
    `evictable`: the ids of those that may go), first by `rank` (lowest priority first by default),
    that make room for `need` compute and the request's GPU memory on it."""
    if not shares:
        return [] if free >= need and mem >= req.gpu_memory_mib else None
    rest, clash = [], []
    for p in shares:
        if _clashes(p, req):  # shares that clash on labels must go whatever their size
            if p.share.reservation_id not in evictable:
                return None
            clash.append(p)
            free, mem = free + p.milli, mem + p.gpu_memory_mib
        elif p.share.reservation_id in evictable:
            rest.append(p)
        elif need == MILLI:
            return None  # a whole GPU: everything on it goes
    if free >= need and mem >= req.gpu_memory_mib:
        return clash
    if (free + sum(p.milli for p in rest) < need
            or mem + sum(p.gpu_memory_mib for p in rest) < req.gpu_memory_mib):
        return None  # not even all of them make room
    rest.sort(key=lambda p: (*rank(p), -p.milli, p.order))  # equal victims: the first placed first
    chosen = clash
    for p in rest:
        chosen.append(p)
        free, mem = free + p.milli, mem + p.gpu_memory_mib
        if free >= need and mem >= req.gpu_memory_mib:
            break
    return chosen


def _short_without(req: Request, cpu_free: int, mem_free: int, victims: Iterable[Holding]) -> bool:
    """Whether the node filters refuse `req` on a node with `cpu_free` and `mem_free` even once
    `victims` are gone."""
    if cpu_free >= req.cpu_milli and mem_free >= req.memory_mib:
        return False
    victims = list(victims)
    return ((req.cpu_milli > 0 and cpu_free + sum(h.cpu_milli for h in victims) < req.cpu_milli)
            or (req.memory_mib > 0 and mem_free + sum(h.node_memory_mib for h in victims) < req.memory_mib))


def _clashes(p: Holding, req: Request) -> bool:
    s = p.share
    if req.anti_affinity & s.anti_affinity:
        return True
    return s.exclusion != req.exclusion


def find_preemption(
    state: ClusterState, req: Request, may_evict: MayEvict = may_evict, rank: Rank = priority_order, *,
    nodes: Iterable[int] | None = None, exclude: Container[str] | None = None,
    among: Iterable[Holding] | None = None, ranked: dict[str, tuple] | None = None,
) -> tuple[Choice, tuple[str, ...], list[Holding]] | None:
    """Where `req` fits after evicting some shares: the choice, the victims, and their holdings,
    already released from `state` (restore them to undo). Options are ranked by number of victims,
    then by the worst victim's rank, then by node order. `nodes`: the nodes to look at (None: all);
    `exclude`: reservations that are never victims (None: `state.reserved_now`, this cycle's
    decisions, which are not running yet); `among`: the only shares `may_evict` may allow (None:
    any; `may_evict` itself: those of the request's team and of priority 0, `state.holdings_of`),
    so that the rule is asked about those alone (holdings no longer in `state` are passed over);
    `ranked`: with `among`, the rule's answers worked out by the caller: the shares of `among` it
    lets go, each with its `rank` (then neither is asked).

    Only nodes with enough GPUs of the request's model and GPU memory, holding a share `may_evict`
    lets it take, are searched: elsewhere no slot has a victim, so no option (an option has some).
    A node whose CPU or memory even all those shares do not free is not searched either: an option
    there would fail the filters.
    """
    if req.gpu_count == 0:
        return None
    if exclude is None:
        exclude = state.reserved_now
    if among is None and may_evict in _CANDIDATES:
        among = _CANDIDATES[may_evict](state, req)
    need = MILLI if req.whole else req.milli
    usable = state.valid & state.ready[:, None] & (state.mem_total >= req.gpu_memory_mib)
    if req.gpu_model is not None:
        usable &= state.model_mask(req.gpu_model)
    if exclude is state.reserved_now:
        # This cycle's reservations stay: a GPU can give at most what the others on it hold.
        usable &= (MILLI - state.fresh_milli >= need) & (state.mem_total - state.fresh_mem >= req.gpu_memory_mib)
    wanted = usable.sum(axis=1) >= req.gpu_count
    if req.cpu_milli > 0 or req.memory_mib > 0:
        # Not where the node filters refuse it even with every share that may go gone.
        cpu, mem = state.held_cpu, state.held_node_mem
        if exclude is state.reserved_now:
            cpu, mem = cpu - state.fresh_cpu, mem - state.fresh_node_mem
        if req.cpu_milli > 0:
            wanted &= state.cpu_free + cpu >= req.cpu_milli
        if req.memory_mib > 0:
            wanted &= state.node_mem_free + mem >= req.memory_mib
    if nodes is not None:
        chosen = np.zeros(len(wanted), dtype=bool)
        chosen[list(nodes)] = True
        wanted &= chosen
    # The shares the rule lets go, per node (asked once each: its answer holds for the search).
    evictable: dict[int, dict[str, Holding]] = {}
    bound: dict[int, tuple] = {}  # per node, the best rank of those it may take there
    protected = state.protected
    if ranked is not None:
        wanted_at = wanted.tolist()
        placed = state.placed
        for h in among if among is not None else ():
            node = h.node
            if not wanted_at[node]:
                continue
            rid = h.share.reservation_id
            key = ranked.get(rid)
            if key is None or rid in exclude or rid in protected or placed.get(rid) is not h:
                continue
            here = evictable.get(node)
            if here is None:
                evictable[node], bound[node] = {rid: h}, key
            else:
                here[rid] = h
                if key < bound[node]:
                    bound[node] = key
    elif among is None:
        for node in np.flatnonzero(wanted).tolist():
            for rid, h in state.on_node.get(node, {}).items():
                if rid not in exclude and rid not in protected and may_evict(h.share, req):
                    evictable.setdefault(node, {})[rid] = h
    else:
        wanted_at = wanted.tolist()
        placed = state.placed
        for h in among:
            if not wanted_at[h.node]:
                continue
            rid = h.share.reservation_id
            if rid not in exclude and rid not in protected and placed.get(rid) is h and may_evict(h.share, req):
                evictable.setdefault(h.node, {})[rid] = h
    ranks: dict[str, tuple] = {} if ranked is None else ranked

    def rank_of(h: Holding) -> tuple:
        key = ranks.get(h.share.reservation_id)
        if key is None:
            key = ranks[h.share.reservation_id] = rank(h)
        return key

    def option_at(node: int) -> tuple[tuple[int, tuple, int], tuple[int, ...], tuple[str, ...]] | None:
        """The node's option: its key (victims, worst victim's rank, node order), slots, victims."""
        victims_here = evictable[node]
        cpu_free, mem_free = int(state.cpu_free[node]), int(state.node_mem_free[node])
        if _short_without(req, cpu_free, mem_free, victims_here.values()):
            return None  # no eviction here frees the CPU or memory it needs
        by_slot: dict[int, list[Holding]] = {}
        for rid, h in state.on_node[node].items():
            if rid not in exclude:
                for j in h.gpus:
                    by_slot.setdefault(j, []).append(h)
        free, mem = state.free[node].tolist(), state.mem_free[node].tolist()
        per_slot = []
        for slot, use in enumerate(usable[node].tolist()):
            if not use:
                continue
            victims = _slot_victims(req, by_slot.get(slot, ()), free[slot], mem[slot], need, victims_here, rank_of)
            if victims is not None:
                top = max([rank_of(p) for p in victims]) if victims else ()
                per_slot.append((len(victims), top, slot, victims))
        if len(per_slot) < req.gpu_count:
            return None
        if req.gpu_count == 1:
            picked = [min(per_slot, key=lambda x: x[:3])]
        else:
            per_slot.sort(key=lambda x: x[:3])
            picked = per_slot[: req.gpu_count]
        gone = {p.share.reservation_id: p for *_, vs in picked for p in vs}
        if not gone:
            return None  # fits without eviction: the filters refused it for another reason
        if _short_without(req, cpu_free, mem_free, gone.values()):
            return None  # these victims leave it short of CPU or memory: it would fail the filters
        ids = tuple(sorted(gone))
        top = max(rank_of(p) for p in gone.values())
        return (len(ids), top, int(state.tie_rank[node])), tuple(x[2] for x in picked), ids

    # Options are tried best first. A node's option is worked out only when no other can come
    # before it: until then it stands in the queue at a bound of its key (one victim, the best
    # rank of those it may take there), which no option of that node is below.
    for node, here in evictable.items():
        if node not in bound:
            bound[node] = min(rank_of(h) for h in here.values())
    tie = state.tie_rank
    queue: list[tuple[tuple[int, tuple, int], int, bool, tuple[int, ...], tuple[str, ...]]] = [
        ((1, bound[node], int(tie[node])), node, False, (), ()) for node in evictable]
    heapq.heapify(queue)
    while queue:
        _, node, known, slots, ids = heapq.heappop(queue)
        if not known:
            option = option_at(node)
            if option is not None:
                heapq.heappush(queue, (option[0], node, True, option[1], option[2]))
            continue
        released = [state.release(i) for i in ids]
        if fits_on(state, req, node, slots):
            return Choice(node, tuple(sorted(slots)), 0.0), ids, released
        for rec in released:
            state.restore(rec)
    return None
