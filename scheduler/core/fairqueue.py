"""The cycle under a quota tree: fair-share order, admission per model, placement, reclaim.

`Fair` wraps one cycle's `fairshare.Ledger`. It orders the queue (the team with the lowest
saturation after admission first, guaranteed requests before the rest; within a team by priority
with aging, then age), places each request on the models where it is admitted best (guaranteed,
then borrowed, then opportunistic), charges the ledger, and when a request within its quota fits
nowhere finds victims: opportunistic work first, then other teams' borrowed shares (the team
furthest above its fair share, lowest priority, newest first), then the team's own lower
priorities. Borrowed victims go after their team's grace: until then the decision is a `Reclaim`.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from .engine import Choice, choose
from .fairshare import INF, Admission, Ledger, QuotaTree, Vec, demand_of, held_by
from .filters import explain, feasible
from .model import Reason, ReasonCode, Request, Share
from .preemption import find_preemption
from .queue import DEFAULT_AGING_S, effective_priority
from .scorers import Scorer
from .state import ClusterState, Holding

ORDER = (Admission.GUARANTEED, Admission.BORROWED, Admission.OPPORTUNISTIC)


def ledger_of(state: ClusterState, tree: QuotaTree, past=None) -> Ledger:
    """The ledger of what `state` holds: capacity per model from ready nodes' GPUs plus what
    counted shares hold on nodes that take nothing new (draining, lost)."""
    capacity: dict[str, Vec] = {}
    for m, model in enumerate(state.models):
        mask = (state.gpu_model == m) & state.valid & state.ready[:, None]
        capacity[model] = (int(mask.sum()) * 1000, int(state.mem_total[mask].sum()), int(mask.sum()))
    shares: list[tuple[Share, str, int]] = []
    for h in state.placed.values():
        if not h.gpus:
            continue
        model = state.models[int(state.gpu_model[h.node, h.gpus[0]])]
        shares.append((h.share, model, len(h.gpus)))
        if not state.ready[h.node] and h.share.admission != Admission.OPPORTUNISTIC and h.share.team in tree.units:
            held = held_by(h.share, len(h.gpus))
            c = capacity[model]
            capacity[model] = (c[0] + held[0], c[1] + held[1], c[2] + held[2])
    return Ledger(tree, capacity, shares, past)


class Fair:
    def __init__(self, state: ClusterState, tree: QuotaTree, pending: Sequence[Request], now: float,
                 past=None, aging_s: float = DEFAULT_AGING_S) -> None:
        self.state, self.tree, self.now, self.aging_s = state, tree, now, aging_s
        self.ledger = ledger_of(state, tree, past)
        self.ledger.deserve(pending)
        self.claimed: set[str] = set()  # victims promised this cycle to a request waiting for a reclaim
        self._models: dict[frozenset[str] | None, list[str]] = {}

    # ---- order --------------------------------------------------------------------------------
    def models_of(self, req: Request) -> list[str]:
        found = self._models.get(req.gpu_model)
        if found is None:
            found = self._models[req.gpu_model] = [m for m in self.state.models
                                                   if req.gpu_model is None or m in req.gpu_model]
        return found

    def _key(self, req: Request) -> tuple[int, float]:
        amount = demand_of(req)
        best_rank, best_sat = 1, INF
        for m in self.models_of(req):
            verdict = self.ledger.verdict(req.team, m, amount, req.priority)
            rank = 0 if verdict.admission == Admission.GUARANTEED else 1
            sat = self.ledger.saturation(req.team, m, amount)
            if (rank, sat) < (best_rank, best_sat):
                best_rank, best_sat = rank, sat
        return best_rank, best_sat

    def order(self, pending: Sequence[Request], skip: set[str]) -> Iterator[Request]:
        """The queue, one request at a time: recomputed after each, since placing one changes its
        team's saturation. Requests whose id is in `skip` (gang members already decided, or added
        to it while iterating) are passed over."""
        teams: dict[str, deque[Request]] = defaultdict(deque)
        for r in sorted(pending, key=lambda r: (-effective_priority(r, self.now, self.aging_s), r.created_at, r.id)):
            teams[r.team].append(r)
        heap: list[tuple[int, float, str]] = []

        def push(team: str) -> None:
            queue = teams[team]
            while queue and queue[0].id in skip:
                queue.popleft()
            if queue:
                heapq.heappush(heap, (*self._key(queue[0]), team))

        for team in sorted(teams):
            push(team)
        while heap:
            _, _, team = heapq.heappop(heap)
            queue = teams[team]
            while queue and queue[0].id in skip:
                queue.popleft()
            if not queue:
                continue
            req = queue.popleft()
            yield req
            push(team)

    # ---- placing ------------------------------------------------------------------------------
    def try_place(self, req: Request, scorer: Scorer, tier: np.ndarray | None = None
                  ) -> tuple[Choice, Admission] | tuple[None, list[Reason]]:
        """Place `req` on the models where it is admitted best; charge the ledger. Else the
        reasons it waits (quota first, then the filters')."""
        models = self.models_of(req)
        groups: dict[Admission | None, list[str]] = {}
        quota_reasons: list[str] = []
        never = True
        amount = demand_of(req)
        for m in models:
            v = self.ledger.verdict(req.team, m, amount, req.priority)
            groups.setdefault(v.admission, []).append(m)
            never = never and v.never
            if v.admission is None and v.reason and v.reason not in quota_reasons:
                quota_reasons.append(v.reason)
        ok_all = None
        for admission in ORDER:
            chosen = groups.get(admission)
            if not chosen:
                continue
            if ok_all is None:
                ok_all = feasible(self.state, req)
            ok = ok_all if len(chosen) == len(models) else ok_all & self.state.model_mask(frozenset(chosen))
            choice = choose(self.state, req, scorer, ok=ok, tier=tier)
            if choice is not None:
                self.state.reserve(req, choice.node, choice.slots, admission=str(admission))
                self.charge(req, choice, admission)
                return choice, admission
        reasons: list[Reason] = []
        if quota_reasons:
            prefix = "can never run as asked: " if never and models else ""
            reasons.append(Reason(ReasonCode.QUOTA, prefix + "; ".join(quota_reasons)))
        if not models or any(a is not None for a in groups):  # no model: the filters say why (model)
            reasons.extend(explain(self.state, req))
        return None, reasons

    def charge(self, req: Request, choice: Choice, admission: Admission) -> None:
        model = self.state.models[int(self.state.gpu_model[choice.node, choice.slots[0]])] if choice.slots else None
        if model is not None:
            self.ledger.charge(req.id, req.team, model, demand_of(req), admission)

    def release(self, req_id: str) -> Holding:
        self.ledger.refund(req_id)
        return self.state.release(req_id)

    # ---- preemption and reclaim ---------------------------------------------------------------
    def _may_evict(self, guaranteed: bool):
        claimed = self.claimed

        def may(share: Share, req: Request) -> bool:
            if share.reservation_id in claimed:
                return False
            if share.team == req.team:
                return share.priority < req.priority  # within a team, priorities order work
            if share.admission == Admission.OPPORTUNISTIC:
                return share.priority < req.priority
            return guaranteed and share.admission == Admission.BORROWED

        return may

    def _rank(self, req: Request):
        def rank(h: Holding) -> tuple:
            s = h.share
            if s.admission == Admission.OPPORTUNISTIC and s.team != req.team:
                kind = 0
            elif s.team != req.team:
                kind = 1
            else:
                kind = 2
            model = self.state.models[int(self.state.gpu_model[h.node, h.gpus[0]])] if h.gpus else ""
            # Most saturated team first, then lowest priority, then newest.
            return (kind, -self.ledger.saturation(s.team, model), s.priority, -s.since)

        return rank

    def preempt(self, req: Request) -> tuple[Choice, tuple[str, ...], Admission, dict[str, float]] | None:
        """Victims that make room for `req`, on the models where it is admitted (guaranteed ones may
        reclaim borrowed shares). Returns the choice (reserved and charged when nothing needs a
        grace; else nothing changed), the victims, the admission and, per victim that must wait, when
        it goes."""
        amount = demand_of(req)
        by: dict[Admission, list[str]] = {}
        for m in self.models_of(req):
            v = self.ledger.verdict(req.team, m, amount, req.priority)
            if v.admission is not None:
                by.setdefault(v.admission, []).append(m)
        for admission in ORDER:
            models = by.get(admission)
            if not models:
                continue
            guaranteed = admission == Admission.GUARANTEED
            if not guaranteed and req.priority <= 0:
                continue  # only reclaim (quota) lets a priority-0 request take another's place
            target = req if len(models) == len(self.models_of(req)) else replace(req, gpu_model=frozenset(models))
            found = find_preemption(self.state, target, self._may_evict(guaranteed), self._rank(req))
            if found is None:
                continue
            choice, victims, released = found
            due = {}
            for h in released:
                s = h.share
                if s.admission == Admission.BORROWED and s.team != req.team:
                    grace = self.tree.units[s.team].reclaim_grace_s if s.team in self.tree.units else 0.0
                    when = s.reclaim_at if s.reclaim_at is not None else self.now + grace
                    if when > self.now:
                        due[s.reservation_id] = when
            if due:
                for h in released:
                    self.state.restore(h)
                self.claimed.update(victims)
                return choice, victims, admission, {v: due.get(v, self.now) for v in victims}
            for v in victims:
                self.ledger.refund(v)
            self.state.reserve(req, choice.node, choice.slots, admission=str(admission))
            self.charge(req, choice, admission)
            return choice, victims, admission, {}
        return None
