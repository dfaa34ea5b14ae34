"""Preemption for the forecast: the cycle's rule (`preemption.find_preemption`) on a few nodes.

The forecast runs preemption after an end, where a guarantee request may now evict lower-priority
work it could not evict before: only on the nodes where something ended or was placed, since the
cycle has already tried everywhere else. `preempt_on` is find_preemption on those nodes, where
what the forecast itself placed may be evicted too (tests/scheduler/test_forecast.py compares it
with find_preemption on every node).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..engine import Choice
from ..model import Request
from ..preemption import find_preemption, may_evict, priority_order
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


def preempt_on(state: ClusterState, req: Request, nodes: Iterable[int]) -> tuple[Choice, tuple[str, ...]] | None:
    """find_preemption restricted to `nodes`, every share there a possible victim (the forecast's
    own placements included). Leaves the state as it found it."""
    if req.priority <= 0 or req.gpu_count == 0:
        return None
    found = find_preemption(state, req, may_evict, priority_order, nodes=nodes, exclude=())
    if found is None:
        return None
    choice, victims, released = found
    for rec in released:
        state.restore(rec)
    return choice, victims
