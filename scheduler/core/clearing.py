"""Where a booking's room can be cleared at least cost, in the shape the booking needs.

The booking check promises a window against the model's capacity in total; the work running when
the lead time begins may sit so that no node has the booking's room (a 4-GPU booking, one
guaranteed share on every node). `clear` picks the node (and GPUs) whose clearing costs least:
first the fewest guaranteed shares, then the least work lost (GPU-seconds run so far by what goes;
work already warned costs nothing, it goes anyway), then the fewest victims, then node order.
What may go at all is the caller's (`allowed`): `bookings.plan` lets other teams' guaranteed work go
only where the room exists on the model in total without it (`room_in_total`), so that it moves
only to give the booking its shape, never to make room the booking check did not count on.
"""

from __future__ import annotations

from collections.abc import Callable, Container

import numpy as np

from .engine import Choice
from .filters import fits_on
from .model import MILLI, Request
from .state import ClusterState, Holding

Evictable = Callable[[object], bool]  # whether a share may go without counting as guaranteed
Cost = tuple[int, float, int]  # guaranteed victims, work lost (GPU-seconds), victims


def lost_work(h: Holding, now: float) -> float:
    """GPU-seconds a victim loses (an evicted job starts again): none for one already warned."""
    if h.share.reclaim_at is not None:
        return 0.0
    return max(0.0, now - h.share.since) * h.milli * len(h.gpus) / MILLI


def _cost(victims: dict[str, Holding], evictable: Evictable, now: float) -> Cost:
    return (sum(1 for h in victims.values() if not evictable(h.share)),
            sum(lost_work(h, now) for h in victims.values()), len(victims))


def _slots(state: ClusterState, req: Request) -> np.ndarray:
    """The GPU slots that may take the request once cleared: ready, of its model, with its memory."""
    usable = state.valid & state.ready[:, None] & (state.mem_total >= req.gpu_memory_mib)
    if req.gpu_model is not None:
        usable &= state.model_mask(req.gpu_model)
    return usable


def _on_slot(state: ClusterState, node: int) -> dict[int, list[Holding]]:
    by_slot: dict[int, list[Holding]] = {}
    for h in state.on_node.get(node, {}).values():
        for j in h.gpus:
            by_slot.setdefault(j, []).append(h)
    return by_slot


def _slot_victims(state: ClusterState, req: Request, node: int, slot: int, here: list[Holding],
                  blocked: Container[str], may_go: Callable[[Holding], bool], now: float,
                  evictable: Evictable) -> dict[str, Holding] | None:
    """The cheapest victims on one slot that make room for one GPU of `req` (whole: all of them),
    or None when what may not go leaves too little."""
    need = MILLI if req.whole else req.milli
    free, mem = int(state.free[node, slot]), int(state.mem_free[node, slot])
    stay = {h.share.reservation_id for h in here if h.share.reservation_id in blocked or not may_go(h)}
    if stay and need == MILLI:
        return None
    out: dict[str, Holding] = {}
    candidates = sorted((h for h in here if h.share.reservation_id not in stay),
                        key=lambda h: (not evictable(h.share), lost_work(h, now), -h.milli))
    for h in candidates:
        if free >= need and mem >= req.gpu_memory_mib and need < MILLI:
            break
        out[h.share.reservation_id] = h
        free, mem = free + h.milli, mem + h.gpu_memory_mib
    if free < need or mem < req.gpu_memory_mib:
        return None  # another booking's held room, or work that stays
    return out


def room_in_total(state: ClusterState, req: Request, blocked: Container[str], evictable: Evictable) -> bool:
    """Whether the model has the booking's room in total counting only free capacity and work that
    `evictable` lets go: whole GPUs for a whole-GPU booking (anywhere), compute and
    memory summed over GPUs for a fraction."""
    usable = _slots(state, req)
    need = MILLI if req.whole else req.milli
    gpus = milli = mem = 0
    for node in map(int, usable.any(axis=1).nonzero()[0]):
        by_slot = _on_slot(state, node)
        for slot in map(int, usable[node].nonzero()[0]):
            here = by_slot.get(slot, [])
            goes = [h for h in here if h.share.reservation_id not in blocked and evictable(h.share)]
            f = int(state.free[node, slot]) + sum(h.milli for h in goes)
            m = int(state.mem_free[node, slot]) + sum(h.gpu_memory_mib for h in goes)
            if need == MILLI:
                gpus += len(goes) == len(here) and f >= MILLI and m >= req.gpu_memory_mib
            else:
                milli, mem = milli + max(f, 0), mem + max(m, 0)
    if need == MILLI:
        return gpus >= req.gpu_count
    return milli >= need and mem >= req.gpu_memory_mib


def clear(state: ClusterState, req: Request, now: float, evictable: Evictable, *, allowed: Evictable | None = None,
          blocked: Container[str] = ()) -> tuple[Choice, tuple[str, ...], list[Holding]] | None:
    """Where `req` fits once the cheapest work is gone: the choice, the victims (none where it
    fits already) and their holdings, released from `state` (restore them to undo). `evictable`:
    what goes without counting as a guaranteed share; `allowed`: what may go at all (None: only
    that); `blocked`: shares that never go (running windows, this cycle's placements, others'
    promised victims)."""
    allowed = allowed or evictable

    def may_go(h: Holding) -> bool:
        return allowed(h.share)

    usable = _slots(state, req)
    enough = usable.sum(axis=1) >= max(req.gpu_count, 1)
    options: list[tuple[Cost, int, int, tuple[int, ...], tuple[str, ...]]] = []
    for node in map(int, enough.nonzero()[0]):
        by_slot = _on_slot(state, node)
        per_slot = []
        for slot in map(int, usable[node].nonzero()[0]):
            victims = _slot_victims(state, req, node, slot, by_slot.get(slot, []), blocked, may_go, now, evictable)
            if victims is not None:
                per_slot.append((_cost(victims, evictable, now), slot, victims))
        if len(per_slot) < req.gpu_count:
            continue
        per_slot.sort(key=lambda x: (x[0], x[1]))
        picked = per_slot[: max(req.gpu_count, 1)]
        gone = {rid: h for *_, vs in picked for rid, h in vs.items()}
        options.append((_cost(gone, evictable, now), int(state.tie_rank[node]), node,
                        tuple(sorted(x[1] for x in picked)), tuple(sorted(gone))))
    for _, _, node, slots, ids in sorted(options):
        released = [state.release(i) for i in ids]
        if fits_on(state, req, node, slots):
            return Choice(node, slots, 0.0), ids, released
        for h in released:
            state.restore(h)
    return None
