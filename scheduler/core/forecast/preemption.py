"""Preemption for the forecast: the cycle's rule (`preemption.find_preemption`) on a few nodes.

The forecast runs preemption after an end, where a guarantee request may now evict lower-priority
work it could not evict before: only on the nodes where something ended or was placed, since the
cycle has already tried everywhere else. `find_preemption` looks at every node and every share,
which at a fleet's size costs more than the whole forecast may; `preempt_on` is the same search
and the same ranking (fewest victims, lowest highest priority, node order) on the nodes given,
over the shares on them, so on the nodes where a preemption can be new it finds what
find_preemption would find (tests/scheduler/test_forecast.py compares the two).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..engine import Choice
from ..filters import feasible
from ..model import Request
from ..preemption import _by_priority, _slot_victims, may_evict
from ..state import ClusterState, Holding


@dataclass
class EvictableRoom:
    """One node as a guarantee request could find it: per GPU slot, free compute plus that of the
    priority-0 shares (anyone with a priority may evict them), CPU and memory likewise, and per
    team its own shares with a priority (its higher priorities may evict them)."""

    node: int
    compute: list[int]
    cpu: int
    memory: int
    own: dict[str, list[Holding]]


def evictable_room(state: ClusterState, i: int, on_node: Mapping[int, Iterable[str]]) -> EvictableRoom:
    room = EvictableRoom(i, state.free[i].tolist(), int(state.cpu_free[i]), int(state.node_mem_free[i]), {})
    for rid in on_node.get(i, ()):
        rec = state.placed.get(rid)
        if rec is None:
            continue
        if rec.share.priority == 0:
            for j in rec.gpus:
                room.compute[j] += rec.milli
            room.cpu += rec.cpu_milli
            room.memory += rec.node_memory_mib
        else:
            room.own.setdefault(rec.share.team, []).append(rec)
    return room


def might_preempt(state: ClusterState, need: tuple[int, int, int, int, int], models: frozenset[int] | None,
                  rooms: Iterable[EvictableRoom], team: str | None = None, priority: int = 0) -> bool:
    """A quick necessary condition for preemption on one of `rooms`' nodes by a request that needs
    `need` (milli per GPU, GPUs, GPU memory, CPU, memory) of one of `models` (ids; None: any): CPU
    and memory, and enough GPUs whose evictable compute covers it (labels and GPU memory not looked
    at). With `team`, its own shares of a priority below `priority` count as evictable too."""
    milli, count, _, cpu_need, mem_need = need
    if count == 0:
        return False
    for room in rooms:
        i = room.node
        if not state.ready[i]:
            continue
        compute, cpu, memory = room.compute, room.cpu, room.memory
        mine = [rec for rec in room.own.get(team, ()) if rec.share.priority < priority] if team is not None else ()
        if mine:
            compute = list(compute)
            for rec in mine:
                for j in rec.gpus:
                    compute[j] += rec.milli
                cpu += rec.cpu_milli
                memory += rec.node_memory_mib
        if cpu < cpu_need or memory < mem_need:
            continue
        row = state.gpu_model[i].tolist()
        slots = sum(1 for j in range(int(state.gpu_count[i]))
                    if compute[j] >= milli and (models is None or row[j] in models))
        if slots >= count:
            return True
    return False


def preempt_on(state: ClusterState, req: Request, nodes: Iterable[int],
               on_node: Mapping[int, Iterable[str]]) -> tuple[Choice, tuple[str, ...]] | None:
    """find_preemption restricted to `nodes` (with `on_node`: node -> reservation ids on it, in the
    order they were placed: ties between victims go as in find_preemption, by that order). Leaves
    the state as it found it."""
    if req.priority <= 0 or req.gpu_count == 0:
        return None
    by_slot: dict[tuple[int, int], list[Holding]] = {}
    for i in nodes:
        for rid in on_node.get(i, ()):
            rec = state.placed.get(rid)
            if rec is not None:
                for j in rec.gpus:
                    by_slot.setdefault((i, j), []).append(rec)
    allowed = list(range(len(state.models)))
    if req.gpu_model is not None:
        allowed = [state.model_id[m] for m in req.gpu_model if m in state.model_id]
    options: list[tuple[tuple[int, int, int], int, tuple[int, ...], tuple[str, ...]]] = []
    for node in sorted(set(nodes)):
        if not state.ready[node]:
            continue
        per_slot = []
        for slot in range(int(state.gpu_count[node])):
            if int(state.gpu_model[node, slot]) not in allowed:
                continue
            if req.gpu_memory_mib > state.mem_total[node, slot]:
                continue
            victims = _slot_victims(state, req, node, slot, by_slot, may_evict, _by_priority)
            if victims is not None:
                top = max((p.share.priority for p in victims), default=-1)
                per_slot.append((len(victims), top, slot, victims))
        if len(per_slot) < req.gpu_count:
            continue
        per_slot.sort(key=lambda x: x[:3])
        picked = per_slot[: req.gpu_count]
        ids = tuple(sorted({p.share.reservation_id for *_, vs in picked for p in vs}))
        if not ids:
            continue
        top = max(state.placed[i].share.priority for i in ids)
        options.append(((len(ids), top, int(state.tie_rank[node])), node, tuple(x[2] for x in picked), ids))
    for _, node, slots, ids in sorted(options):
        released = [state.release(i) for i in ids]
        ok = feasible(state, req)
        for rec in released:
            state.restore(rec)
        if all(ok[node, j] for j in slots):
            return Choice(node, tuple(sorted(slots)), 0.0), ids
    return None
