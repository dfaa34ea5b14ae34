"""GPU room held by claims another scheduler allocated: a pod left to the default kube-scheduler that
names our DeviceClasses gets its claim allocated from our ResourceSlices by the kube-scheduler, not
by our cycle. Housekeeping reads those allocations (`observe`: one list of the claims, through
`KubernetesBackend.foreign_shares`); each cycle's snapshot counts them as shares on their GPUs
(`shares_by_gpu`), so our cycle never places into room the kube-scheduler already gave away.

Such a share is nobody's reservation: it carries no team, the highest priority and a guaranteed
admission, so no rule of the engine may evict or reclaim it (scheduler/core: preemption.may_evict,
fairqueue). What was last observed stays until the next observation: a cluster that stops answering
leaves the room counted as used, never as free.
"""

from __future__ import annotations

import logging

from django.core.cache import cache

from scheduler import core
from scheduler.backends import Backend, BackendError

from . import fleet_cache

log = logging.getLogger(__name__)

CACHE_KEY = "placement:foreign-claims"
PRIORITY = 100  # the highest: never a victim
MILLI = 1000


def observe(backend: Backend) -> int | None:
    """Read what other schedulers' claims hold now (None: this backend has no DRA, or the read failed
    and the last observation stays)."""
    read = getattr(backend, "foreign_shares", None)
    if read is None:
        return None
    try:
        shares = read()
    except BackendError as exc:
        log.warning("could not read the claims other schedulers allocated (the last ones read still count): %s",
                    exc)
        return None
    cache.set(CACHE_KEY, [(s.node, s.gpu_index, s.milli, s.memory_mib, s.claim) for s in shares], timeout=None)
    return len(shares)


def shares_by_gpu(fleet: fleet_cache.Fleet) -> dict[int, list[core.Share]]:
    """GPU id → the shares other schedulers' claims hold on it, as the engine counts used room."""
    observed = cache.get(CACHE_KEY) or []
    if not observed:
        return {}
    gpus = {(node.name, gpu.index): (pk, gpu.memory_mib) for node in fleet.nodes
            for pk, gpu in zip(node.gpu_pks, node.blank.gpus, strict=True)}
    out: dict[int, list[core.Share]] = {}
    for node, index, milli, memory_mib, claim in observed:
        if (node, index) not in gpus:
            continue  # a GPU the portal does not know (not in its inventory): not ours to place on
        pk, card_mib = gpus[(node, index)]
        out.setdefault(pk, []).append(core.Share(
            reservation_id=f"claim {claim}", gpu_request=min(1.0, max(milli, 1) / MILLI),
            gpu_memory_mib=min(card_mib, memory_mib) if memory_mib is not None else card_mib,
            priority=PRIORITY, team="", admission="guaranteed"))
    return out
