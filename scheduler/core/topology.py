"""Which GPUs of a node a multi-GPU request takes: NVLink-connected first, then one NUMA node."""

from __future__ import annotations

from itertools import combinations

import numpy as np

from .state import ClusterState

# Above this many candidate sets, fall back to a greedy pick instead of trying every combination.
MAX_COMBINATIONS = 2_000


def pick_gpus(state: ClusterState, node: int, ok_row: np.ndarray, count: int) -> tuple[int, ...]:
    slots = [int(j) for j in np.flatnonzero(ok_row)]
    if len(slots) < count:
        raise ValueError(f"node {state.node_names[node]} has {len(slots)} feasible GPUs, {count} wanted")
    nvlink = state.nvlink[node] if state.nvlink is not None else None
    numa = state.numa[node] if state.numa is not None else None
    has_links = nvlink is not None and any(nvlink)
    has_numa = numa is not None and len(set(numa)) > 1
    if count == len(slots) or not (has_links or has_numa):
        return tuple(slots[:count])  # lowest indexes, as the reference simulator does

    def closeness(chosen: tuple[int, ...]) -> tuple[int, int, int]:
        links = sum(1 for a, b in combinations(chosen, 2) if nvlink and b in nvlink[a])
        same_numa = sum(1 for a, b in combinations(chosen, 2) if numa and numa[a] == numa[b])
        return (links, same_numa, -sum(chosen))

    n_sets = _n_choose_k(len(slots), count)
    if n_sets <= MAX_COMBINATIONS:
        return max(combinations(slots, count), key=closeness)
    chosen: list[int] = []
    for _ in range(count):  # greedy: add the slot that keeps the set closest
        rest = [s for s in slots if s not in chosen]
        chosen.append(max(rest, key=lambda s: closeness((*chosen, s))))
    return tuple(sorted(chosen))


def _n_choose_k(n: int, k: int) -> int:
    from math import comb

    return comb(n, k)
