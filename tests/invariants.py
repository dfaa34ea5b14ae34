"""The invariant every placement keeps: no GPU over-committed, checked by the placement tests."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from portal.fleet.models import Gpu
from portal.reservations.models import Allocation


def live_shares_ok() -> list[str]:
    """Every GPU's live shares sum to at most 1 and its memory to at most the card's. Returns
    the GPUs that break it, in words (empty: all is well)."""
    problems = []
    totals: dict[int, list] = defaultdict(lambda: [Decimal(0), 0])
    for gpu_id, share, memory in Allocation.objects.filter(released_at__isnull=True).values_list(
            "gpu_id", "gpu_request", "gpu_memory_mib"):
        totals[gpu_id][0] += share
        totals[gpu_id][1] += memory
    cards = dict(Gpu.objects.filter(pk__in=totals).values_list("pk", "memory_mib"))
    for gpu_id, (share, memory) in totals.items():
        if share > 1 or memory > cards[gpu_id]:
            problems.append(f"GPU {gpu_id}: share {share}, memory {memory}/{cards[gpu_id]} MiB")
    return problems
