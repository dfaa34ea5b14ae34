"""What a reclaim by fair share might take in one cycle, indexed once (`fairqueue.Fair`)."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

import numpy as np

from .fairshare import COUNTED, Admission, Ledger, Vec
from .state import ClusterState, Holding


class TakeableIndex:
    """What a reclaim by fair share might take, indexed once a cycle (at its first reclaim by fair
    share) from the shares running then (this cycle's placements are never victims, and victims
    only leave, so it bounds what later searches find):
    - `by_model`: the borrowed, opportunistic and warned shares, per model of their GPUs: with the
      team's own, the only shares `Fair._may_take_by_share` lets go;
    - `givable`: per GPU slot (nodes x slots x 3), the counted use (what the ledger would refund)
      that the borrowed and warned shares of every team hold there (a share counts on each slot
      it holds; opportunistic work is not counted); `most`, per model, the most of that on one
      slot and on one node; `own`, per team, its other counted shares as (priority, node, slots,
      amount), which only the team's own higher priorities may take; `slot_rows`, per model, each
      distinct `givable` of a GPU of a ready node and the most GPU memory of such a GPU; `by_team`, per team its
      shares, lowest priority first."""

    def __init__(self, state: ClusterState, ledger: Ledger) -> None:
        self.by_model: dict[str, list[Holding]] = defaultdict(list)
        self.givable = np.zeros((*state.free.shape, 3), dtype=np.int64)
        self.own: dict[str, list[tuple[int, int, tuple[int, ...], Vec]]] = defaultdict(list)
        team_shares: dict[str, list[Holding]] = defaultdict(list)
        for rid, h in state.placed.items():
            s = h.share
            if rid in state.reserved_now or not h.gpus:
                continue
            team_shares[s.team].append(h)
            warned = s.reclaim_at is not None
            if warned or s.admission in (Admission.BORROWED, Admission.OPPORTUNISTIC):
                for m in {state.model_at(h.node, j) for j in h.gpus}:
                    self.by_model[m].append(h)
            entry = ledger.holdings.get(rid)
            if entry is None or entry[3] not in COUNTED:
                continue
            if warned or s.admission == Admission.BORROWED:
                for j in h.gpus:
                    self.givable[h.node, j] += entry[2]
            else:
                self.own[s.team].append((s.priority, h.node, h.gpus, entry[2]))
        for shares in self.own.values():
            shares.sort(key=lambda x: x[0])
        # Per team, what its first k other counted shares hold on all their GPUs together.
        self._own_totals: dict[str, list[Vec]] = {}
        for team, shares in self.own.items():
            totals = [(0, 0, 0)]
            for _, _, gpus, a in shares:
                t = totals[-1]
                totals.append((t[0] + a[0] * len(gpus), t[1] + a[1] * len(gpus), t[2] + a[2] * len(gpus)))
            self._own_totals[team] = totals
        self.by_team = {team: sorted(hs, key=lambda h: h.share.priority) for team, hs in team_shares.items()}
        per_node = self.per_node = self.givable.sum(axis=1)  # (nodes x 3)
        self.most: dict[str, tuple[Vec, Vec]] = {}
        for m, model in enumerate(state.models):
            at = state.gpu_model == m
            self.most[model] = (tuple(self.givable[at].max(axis=0).tolist()),
                                tuple(per_node[at.any(axis=1)].max(axis=0).tolist()))
        # Per model, the distinct givable use on one GPU of a ready node, with the most GPU memory
        # of such a GPU (a request asking for more cannot take it): a few rows instead of every GPU.
        self.slot_rows: dict[str, dict[Vec, int]] = defaultdict(dict)
        open_gpus = state.valid & state.ready[:, None]
        for (node, j), row, memory in zip(np.argwhere(open_gpus).tolist(), self.givable[open_gpus].tolist(),
                                          state.mem_total[open_gpus].tolist(), strict=True):
            rows = self.slot_rows[state.models[int(state.gpu_model[node, j])]]
            key = tuple(row)
            rows[key] = max(rows.get(key, memory), memory)

    def own_below(self, team: str, priority: int) -> tuple[list[tuple[int, int, tuple[int, ...], Vec]], Vec]:
        """The team's other counted shares below `priority` (see `own`), and what they hold on all
        their GPUs together."""
        shares = self.own.get(team)
        if not shares:
            return [], (0, 0, 0)
        k = bisect_left(shares, priority, key=lambda x: x[0])
        return shares[:k], self._own_totals[team][k]
