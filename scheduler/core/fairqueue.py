"""The cycle under a quota tree: fair-share order, admission per model, placement, reclaim.

`Fair` wraps one cycle's `fairshare.Ledger`. It orders the queue (the team with the lowest
saturation after admission first, guaranteed requests before the rest; within a team by priority
with aging, then age), places each request on the models where it is admitted best (guaranteed,
then borrowed, then opportunistic), charges the ledger, and when a request within its quota fits
nowhere finds victims: opportunistic work first, then other teams' borrowed shares (the team
furthest above its fair share, lowest priority, newest first), then the team's own lower
priorities. Borrowed victims go after their team's grace: until then the decision is a `Reclaim`.
A request within its quota whose department is at its borrowing limit because others below it
borrowed (`Verdict.reclaim`) is not placed on free GPUs beyond that limit: it takes back those
borrowed shares, then places; every preemption is checked against the ledger with its victims gone.
A request that is neither and fits nowhere may still **reclaim by fair share** when its team is
below its deserved share on a model (`below_share`): other teams' borrowed shares, of teams that
stay at or above their share without them (`above_share`), in the same order and with the same grace.

Evictions are rationed, since a requeued job runs again from the start. A share already warned of a
reclaim (`reclaim_at`: its pod got SIGTERM then) is leaving whatever happens: it is the first victim
of any request, so a started reclaim is never wasted. For takers that are not guaranteed (borrowed
or opportunistic), another team's work is protected while it has run less than `min_run_s` and,
once evicted `EVICTION_CAP` times within `EVICTION_WINDOW_S`, for the next `EVICTION_WINDOW_S`; and
priority-0 work goes only for a team below its fair share. A multi-GPU request that fits nowhere
even so may **hold a node** (`hold`): the node its GPUs can be freed on at the least cost, whose
evictable work is reclaimed with its grace while nothing else is placed there this cycle.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

import numpy as np

from .engine import Choice, choose
from .fairshare import (
    COUNTED,
    INF,
    ZERO,
    Admission,
    Ledger,
    QuotaTree,
    Vec,
    demand_of,
    held_by,
    vec_add,
    vec_le,
    vec_scale,
)
from .filters import explain, feasible
from .model import Reason, ReasonCode, Request, Share
from .preemption import find_preemption
from .queue import DEFAULT_AGING_S, effective_priority
from .scorers import BestFitScorer, Scorer
from .segregation import NodeKinds, placement_tier
from .state import ClusterState, Holding
from .takeable import TakeableIndex

ORDER = (Admission.GUARANTEED, Admission.BORROWED, Admission.OPPORTUNISTIC)
_OPPORTUNISTIC, _BORROWED = 3, 4  # `Fair._candidates_on`'s kinds that the taker's priority settles
GivenBack = dict[str, tuple[str, str, Vec, Admission]]  # victim → what the ledger held: team, model, amount, how
MIN_RUN_S = 600.0  # another team's work younger than this is not evicted for a taker that is not guaranteed
EVICTION_CAP = 2  # evicted this often within EVICTION_WINDOW_S: protected as above for the next window
# 4 h, not 1 h: in the replay the jobs evicted most (10-17 times a day) ran, waited and ran again
# in rounds of one to two hours, so an hour's window never saw two of their evictions.
EVICTION_WINDOW_S = 4 * 3600.0


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
        model = state.model_at(h.node, h.gpus[0])
        shares.append((h.share, model, len(h.gpus)))
        if not state.ready[h.node] and h.share.admission != Admission.OPPORTUNISTIC and h.share.team in tree.units:
            held = held_by(h.share, len(h.gpus))
            c = capacity[model]
            capacity[model] = (c[0] + held[0], c[1] + held[1], c[2] + held[2])
    return Ledger(tree, capacity, shares, past)


def _preemptible(share: Share, req: Request) -> bool:
    """Another team's share any higher priority may take at once: opportunistic, or priority 0
    (counted in a quota or not, as KubeShare's priority 0 is)."""
    return (share.admission == Admission.OPPORTUNISTIC or share.priority == 0) and share.priority < req.priority


def _reclaim_key(req: Request) -> tuple:
    """All of a request that a reclaim by fair share reads: everything but its id and age."""
    return (req.team, req.priority, req.gpu_request, req.gpu_limit, req.gpu_memory_mib, req.gpu_count, req.gpu_model,
            req.affinity, req.anti_affinity, req.exclusion, req.group, req.cpu_milli, req.memory_mib)


def _newer(reservation_id: str) -> tuple:
    return (0, -int(reservation_id)) if reservation_id.isdigit() else (1, reservation_id)


class Fair:
    def __init__(self, state: ClusterState, tree: QuotaTree, pending: Sequence[Request], now: float,
                 past=None, aging_s: float = DEFAULT_AGING_S, *, min_run_s: float = MIN_RUN_S,
                 evictions: Mapping[str, Sequence[float]] | None = None, keep_apart: bool = False) -> None:
        self.state, self.tree, self.now, self.aging_s = state, tree, now, aging_s
        self.min_run_s = min_run_s
        self.evictions = evictions or {}  # reservation → when it was evicted before (requeued)
        self.ledger = ledger_of(state, tree, past)
        self.ledger.deserve(pending)
        self.claimed: set[str] = set()  # victims promised this cycle to a request waiting for a reclaim
        # shares warned of a reclaim before this cycle (their pods got SIGTERM): `_take_warned`'s only victims
        self._warned = [rid for rid, h in state.placed.items() if h.share.reclaim_at is not None]
        self._scorer: Scorer | None = None  # the cycle's, as try_place last had it (placing after a reclaim)
        # The snapshot's borrowed shares with their model: all a reclaim may take back (what this
        # cycle places is never a victim), listed once instead of searched for per request.
        self._model_of = {h.share.reservation_id: state.model_at(h.node, h.gpus[0])
                          for h in state.placed.values() if h.gpus}
        self._borrowed = [(h, self._model_of[h.share.reservation_id]) for h in state.placed.values()
                          if h.gpus and h.share.admission == Admission.BORROWED]
        self._models: dict[frozenset[str] | None, list[str]] = {}
        # Reclaims by fair share decided this cycle but not yet due: (team, model) → what the
        # taker is promised and what the victim team will lose, so that a team's next requests in
        # the same cycle see where it will stand (no reclaiming twice for the same gap).
        self._promised: dict[tuple[str, str], Vec] = defaultdict(lambda: (0, 0, 0))
        self._losing: dict[tuple[str, str], Vec] = defaultdict(lambda: (0, 0, 0))
        for h, m in self._borrowed:  # warned before: they go, whoever takes their place
            if h.share.reclaim_at is not None:
                key = (h.share.team, m)
                self._losing[key] = vec_add(self._losing[key], held_by(h.share, len(h.gpus)))
        self.held = np.zeros(len(state.node_names), dtype=bool)  # nodes held this cycle (`hold`)
        self._held_models: set[str] = set()
        self._protected_now: dict[str, bool] = {}  # `_protected`, per reservation
        self._rank_tails: dict[str, tuple] = {}  # `_rank`'s parts fixed for the cycle, per reservation
        # `above_share`'s answers: (team, model, losing) → (the team's use, its losing then, answer)
        self._above: dict[tuple[str, str, Vec], tuple[Vec, Vec, bool]] = {}
        self._takeable: TakeableIndex | None = None  # built by the first reclaim by fair share
        # What the cycle has decided so far, counted: every charge, release, eviction, claim and
        # node hold moves it (`_changed`); a search that fails puts back all it tried, so it does
        # not. What a reclaim by fair share works out from the ledger and the running shares is kept
        # while it stands: a failed search per request shape (`_no_reclaim`), the shares it may take
        # per model and team with their rank (`_candidates`, `_own`). A charge changes only its
        # team's use (its shares' rank, whether they may go): that team's are worked out again; any
        # other change (a release, an eviction, a claim, a hold) starts them all afresh.
        self.changes = 0
        self._candidates: dict[str, dict[str, list[tuple]]] = {}  # model → team → `_candidates_on`'s
        self._own: dict[str, tuple[list[tuple[Holding, str, tuple]], list[int]]] = {}  # `_own_ranked`'s
        self._stale_teams: set[str] = set()
        self._stale_all = False
        self._by_model_team: dict[str, dict[str, list[Holding]]] = {}  # `_takeable_teams`'
        self._no_reclaim: dict[tuple, tuple[int, int]] = {}  # `_reclaim_key` → `_changes_now` when it failed
        self._kinds = NodeKinds(state) if keep_apart else None  # what nodes hold, for `placement_tier`

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
    def verdicts(self, req: Request) -> tuple[dict[Admission | None, list[str]], list[Reason], bool]:
        """The request's models grouped by how it would be admitted on each (None: waits, or its
        quota is lent out and is taken back first), the quota reasons of those where it waits, and
        whether it can never run on any."""
        models = self.models_of(req)
        groups: dict[Admission | None, list[str]] = {}
        texts: list[str] = []
        never = bool(models)
        amount = demand_of(req)
        for m in models:
            v = self.ledger.verdict(req.team, m, amount, req.priority)
            admission = None if v.reclaim else v.admission  # its quota is lent out: reclaimed (preempt), not taken
            groups.setdefault(admission, []).append(m)
            never = never and v.never
            if admission is None and v.reason and v.reason not in texts:
                texts.append(v.reason)
        reasons = []
        if texts:
            prefix = "can never run as asked: " if never else ""
            reasons.append(Reason(ReasonCode.QUOTA, prefix + "; ".join(texts)))
        return groups, reasons, never

    def try_place(self, req: Request, scorer: Scorer, tier: np.ndarray | None = None
                  ) -> tuple[Choice, Admission] | tuple[None, list[Reason]]:
        """Place `req` on the models where it is admitted best; charge the ledger. Else the
        reasons it waits (quota first, then the filters')."""
        self._scorer = scorer
        models = self.models_of(req)
        groups, reasons, _ = self.verdicts(req)
        ok_all = None
        for admission in ORDER:
            chosen = groups.get(admission)
            if not chosen:
                continue
            if ok_all is None:
                ok_all = feasible(self.state, req)
            ok = ok_all if len(chosen) == len(models) else ok_all & self.state.model_mask(frozenset(chosen))
            if self.held.any():
                ok = ok & ~self.held[:, None]
            # A gang's closeness comes first; else, with `keep_apart`, guaranteed work is kept apart.
            where = tier if tier is not None or self._kinds is None else placement_tier(self._kinds, admission)
            choice = choose(self.state, req, scorer, ok=ok, tier=where)
            if choice is not None:
                self.state.reserve(req, choice.node, choice.slots, admission=str(admission))
                self.charge(req, choice, admission)
                return choice, admission
        if not models or any(a is not None for a in groups):  # no model: the filters say why (model)
            reasons.extend(explain(self.state, req))
        return None, reasons

    def _changed(self, team: str | None = None) -> None:
        """A decision changed the state or the ledger: for `team`'s use alone, or anything."""
        self.changes += 1
        if team is None:
            self._stale_all = True
        else:
            self._stale_teams.add(team)

    def charge(self, req: Request, choice: Choice, admission: Admission) -> None:
        self._changed(req.team)
        model = self.state.model_at(choice.node, choice.slots[0]) if choice.slots else None
        if model is not None:
            self.ledger.charge(req.id, req.team, model, demand_of(req), admission)

    def release(self, req_id: str) -> Holding:
        self._changed()
        self.ledger.refund(req_id)
        return self.state.release(req_id)

    # ---- preemption and reclaim ---------------------------------------------------------------
    def _open_nodes(self) -> list[int] | None:
        """The nodes a search may use: all (None) unless some are held for a request this cycle."""
        return None if not self.held.any() else np.flatnonzero(~self.held).tolist()

    def _protected(self, share: Share) -> bool:
        """Whether another team's `share` is kept from takers that are not guaranteed: it started
        less than `min_run_s` ago, or it was evicted `EVICTION_CAP` times within a window that
        ended less than a window ago (the same job evicted again and again is the worst wait).
        Fixed for the cycle (its clock and evictions are), so answered once per share."""
        found = self._protected_now.get(share.reservation_id)
        if found is None:
            found = self._protected_now[share.reservation_id] = self._protected_by_rule(share)
        return found

    def _protected_by_rule(self, share: Share) -> bool:
        if self.now - share.since < self.min_run_s:
            return True
        times = sorted(self.evictions.get(share.reservation_id, ()))
        k = EVICTION_CAP - 1
        return any(times[i + k] - times[i] <= EVICTION_WINDOW_S and self.now - times[i + k] < EVICTION_WINDOW_S
                   for i in range(len(times) - k))

    def _may_evict(self, guaranteed: bool):
        claimed = self.claimed

        def may(share: Share, req: Request) -> bool:
            if share.reservation_id in claimed:
                return False
            if share.team == req.team:
                return share.priority < req.priority  # within a team, priorities order work
            if share.reclaim_at is not None:
                return True  # warned of a reclaim: it goes anyway
            if not guaranteed and self._protected(share):
                return False
            if _preemptible(share, req):
                # Opportunistic work makes way for other non-guaranteed work only of a team below its share.
                return guaranteed or self.below_share(req.team, self._model_of[share.reservation_id], demand_of(req))
            return guaranteed and share.admission == Admission.BORROWED

        return may

    def _may_evict_among(self, req: Request, guaranteed: bool) -> list[Holding]:
        """The only shares `_may_evict(guaranteed)` can let go (from the state's indexes): the team's
        own, opportunistic and priority-0 work, those warned of a reclaim, and for a guaranteed
        taker borrowed work; not other teams' guaranteed work above priority 0, most of the fleet."""
        admissions = (Admission.OPPORTUNISTIC, Admission.BORROWED) if guaranteed else (Admission.OPPORTUNISTIC,)
        placed = self.state.placed
        among = list(self.state.holdings_of(teams=(req.team,), admissions=admissions, priorities=(0,)).values())
        among.extend(placed[rid] for rid in self._warned if rid in placed)
        return among

    def _rank(self, req: Request):
        saturation, model_of, tails = self.ledger.saturation, self._model_of, self._rank_tails

        def rank(h: Holding) -> tuple:
            s = h.share
            if s.team != req.team and s.reclaim_at is not None:
                kind = -1  # leaving anyway
            elif s.team != req.team and _preemptible(s, req):
                kind = 0
            elif s.team != req.team:
                kind = 1
            else:
                kind = 2
            rid = s.reservation_id
            model = model_of.get(rid) if h.gpus else ""
            if model is None:
                model = self.state.model_at(h.node, h.gpus[0])
            # Most saturated team first, then lowest priority, then newest (placed later, or in the
            # same commit submitted later: a higher id).
            tail = tails.get(rid)
            if tail is None:
                tail = tails[rid] = (s.priority, -s.since, _newer(rid))
            return (kind, -saturation(s.team, model), *tail)

        return rank

    def _refund_if_it_makes_room(self, req: Request, choice: Choice, admission: Admission, victims: tuple[str, ...]
                                 ) -> GivenBack | None:
        """Refund the victims and return what they held, when without them `req` is admitted on the
        chosen GPUs' model as `admission` or better (a reclaim must give back what its quota lent,
        not only a free GPU); else change nothing and return None."""
        held = {v: self.ledger.holdings[v] for v in victims if v in self.ledger.holdings}
        for v in held:
            self.ledger.refund(v)
        model = self.state.model_at(choice.node, choice.slots[0])
        v = self.ledger.verdict(req.team, model, demand_of(req), req.priority)
        if v.admission is not None and not v.reclaim and ORDER.index(v.admission) <= ORDER.index(admission):
            return held
        for rid, (team, m, amount, adm) in held.items():
            self.ledger.charge(rid, team, m, amount, adm)
        return None

    def _take_back(self, req: Request, models: list[str]
                   ) -> tuple[Choice, tuple[str, ...], list[Holding], GivenBack] | None:
        """For a request within its quota whose quota is lent out on `models` (a department on its
        path at its borrowing limit): other teams' borrowed shares on them, in `_rank` order, each
        taken only when giving it back narrows how far the request would pass that limit, until it
        is admitted as guaranteed on one of them and fits there (evicting more by find_preemption if
        it must). Returns the choice, the victims, their holdings (released from the state) and what
        the ledger held for them (refunded); else None, with nothing changed."""
        placed = self.state.placed
        may = self._may_evict(True)
        candidates = [h for h, m in self._borrowed if m in models and h.share.team != req.team
                      and placed.get(h.share.reservation_id) is h and may(h.share, req)]
        if not candidates:
            return None
        amount = demand_of(req)
        rank = self._rank(req)
        candidates.sort(key=lambda h: (rank(h), h.share.reservation_id))

        def lacking() -> list[float]:
            out: list[float] = []
            for m in models:
                out.extend(self.ledger.excess(self.tree.path(req.team, m), amount))
            return out

        released: list[Holding] = []
        held: GivenBack = {}
        for h in candidates:
            rid = h.share.reservation_id
            entry = self.ledger.holdings.get(rid)
            if entry is None:
                continue
            before = lacking()
            self.ledger.refund(rid)
            if not any(a < b for a, b in zip(lacking(), before, strict=True)):
                self.ledger.charge(rid, *entry)  # giving it back does not help this request
                continue
            held[rid] = entry
            released.append(self.state.release(rid))
            for m in models:
                v = self.ledger.verdict(req.team, m, amount, req.priority)
                if v.admission != Admission.GUARANTEED or v.reclaim:
                    continue
                target = replace(req, gpu_model=frozenset([m]))
                ok = feasible(self.state, target) & ~self.held[:, None]
                choice = choose(self.state, target, self._scorer or BestFitScorer(), ok=ok)
                if choice is not None:
                    return choice, tuple(sorted(held)), released, held
                # It fits nowhere yet: evict more.
                more = find_preemption(self.state, target, may, rank, nodes=self._open_nodes())
                if more is None:
                    continue
                choice, extra, extra_released = more
                extra_held = self._refund_if_it_makes_room(req, choice, Admission.GUARANTEED, extra)
                if extra_held is None:
                    for x in extra_released:
                        self.state.restore(x)
                    continue
                return choice, tuple(sorted({*held, *extra})), released + extra_released, held | extra_held
        for x in released:
            self.state.restore(x)
        for rid, entry in held.items():
            self.ledger.charge(rid, *entry)
        return None

    def preempt(self, req: Request) -> tuple[Choice, tuple[str, ...], Admission, dict[str, float]] | None:
        """Victims that make room for `req`, on the models where it is admitted (guaranteed ones may
        reclaim borrowed shares). Returns the choice (reserved and charged when nothing needs a
        grace; else nothing changed), the victims, the admission and, per victim that must wait, when
        it goes."""
        amount = demand_of(req)
        by: dict[Admission, list[str]] = {}
        lent: set[str] = set()  # models where its quota is lent out (Verdict.reclaim)
        for m in self.models_of(req):
            v = self.ledger.verdict(req.team, m, amount, req.priority)
            if v.admission is not None:
                by.setdefault(v.admission, []).append(m)
            if v.reclaim:
                lent.add(m)
        for admission in ORDER:
            models = by.get(admission)
            if not models:
                continue
            guaranteed = admission == Admission.GUARANTEED
            if not guaranteed and req.priority <= 0:
                continue  # only reclaim (quota) lets a priority-0 request take another's place
            found = None
            free = [m for m in models if m not in lent]
            if free:
                target = req if len(free) == len(self.models_of(req)) else replace(req, gpu_model=frozenset(free))
                found = find_preemption(self.state, target, self._may_evict(guaranteed), self._rank(req),
                                        nodes=self._open_nodes(), among=self._may_evict_among(req, guaranteed))
                if found is not None:
                    choice, victims, released = found
                    given_back = self._refund_if_it_makes_room(req, choice, admission, victims)
                    if given_back is None:
                        for h in released:
                            self.state.restore(h)
                        found = None
            if found is None and guaranteed and len(free) < len(models):
                taken = self._take_back(req, [m for m in models if m in lent])
                if taken is not None:
                    choice, victims, released, given_back = taken
                    found = (choice, victims, released)
            if found is None:
                continue
            return self._evict(req, choice, victims, released, given_back, admission)
        taken = self._take_warned(req) or self._take_by_share(req)
        if taken is None:
            return None
        choice, victims, released, given_back, admission = taken
        return self._evict(req, choice, victims, released, given_back, admission)

    def _evict(self, req: Request, choice: Choice, victims: tuple[str, ...], released: list[Holding],
               given_back: GivenBack, admission: Admission
               ) -> tuple[Choice, tuple[str, ...], Admission, dict[str, float]]:
        """Other teams' borrowed victims go after their team's grace: then nothing changes now
        (they run and stay charged until then) and each victim's time is returned; else the
        victims go now and `req` is reserved and charged."""
        self._changed()
        due = {}
        for h in released:
            s = h.share
            if s.admission == Admission.BORROWED and s.team != req.team and not _preemptible(s, req):
                grace = self.tree.units[s.team].reclaim_grace_s if s.team in self.tree.units else 0.0
                when = s.reclaim_at if s.reclaim_at is not None else self.now + grace
                if when > self.now:
                    due[s.reservation_id] = when
        if due:
            for h in released:
                self.state.restore(h)
            for rid, (team, model, amount_, adm) in given_back.items():  # they run until then
                self.ledger.charge(rid, team, model, amount_, adm)
                if adm in COUNTED and team != req.team and self.state.placed[rid].share.reclaim_at is None:
                    self._losing[(team, model)] = vec_add(self._losing[(team, model)], amount_)
            if admission == Admission.BORROWED:
                model = self.state.model_at(choice.node, choice.slots[0])
                self._promised[(req.team, model)] = vec_add(self._promised[(req.team, model)], demand_of(req))
            self.claimed.update(victims)
            return choice, victims, admission, {v: due.get(v, self.now) for v in victims}
        for v in victims:
            self.ledger.refund(v)
        self.state.reserve(req, choice.node, choice.slots, admission=str(admission))
        self.charge(req, choice, admission)
        return choice, victims, admission, {}

    def _take_warned(self, req: Request
                     ) -> tuple[Choice, tuple[str, ...], list[Holding], GivenBack, Admission] | None:
        """Room that shares already warned of a reclaim leave (their pods got SIGTERM: they go
        whatever happens), for any request admitted there once they are gone: a reclaim whose taker
        no longer needs it (placed elsewhere, or no longer below its share) is not wasted."""
        models = [m for m in self.models_of(req) if not self.ledger.verdict(req.team, m, demand_of(req),
                                                                             req.priority).never]
        if not models:
            return None

        def may(share: Share, r: Request) -> bool:
            return share.reclaim_at is not None and share.team != r.team and share.reservation_id not in self.claimed

        placed = self.state.placed
        among = [placed[rid] for rid in self._warned if rid in placed]
        if not among:
            return None  # no victim may go, so no option: an option has victims
        target = req if len(models) == len(self.models_of(req)) else replace(req, gpu_model=frozenset(models))
        found = find_preemption(self.state, target, may, self._rank(req), nodes=self._open_nodes(), among=among)
        if found is None:
            return None
        choice, victims, released = found
        given_back = self._refund_if_it_makes_room(req, choice, Admission.OPPORTUNISTIC, victims)
        if given_back is None:
            for h in released:
                self.state.restore(h)
            return None
        model = self.state.model_at(choice.node, choice.slots[0])
        return choice, victims, released, given_back, self.ledger.verdict(req.team, model, demand_of(req),
                                                                          req.priority).admission

    # ---- reclaim by fair share ----------------------------------------------------------------
    def below_share(self, team: str, model: str, amount: Vec) -> bool:
        """Whether `team` may take `amount` of `model` back by fair share: with half of it (and what
        earlier reclaims this cycle promised it) its saturation is at most 1. Whole GPUs come in
        units: a team takes one when that leaves it nearer its share than it was, never to stand
        further above its share than it stood below (hysteresis: it cannot then be taken back)."""
        extra = vec_add(self._promised[(team, model)], vec_scale(amount, 0.5))
        return self.ledger.saturation(team, model, extra) <= 1

    def above_share(self, team: str, model: str, losing: Vec) -> bool:
        """Whether `team` stays at or above its fair share of `model` after losing `losing` (and
        what earlier reclaims this cycle take from it): only then may a reclaim take it, so the
        victim is never pushed below its share (from where it would take it back)."""
        key = (team, model, losing)
        used, before = self.ledger.team_used.get((team, model), ZERO), self._losing.get((team, model), ZERO)
        found = self._above.get(key)
        if found is not None and found[0] == used and found[1] == before:
            return found[2]
        above = self.ledger.saturation(team, model, vec_scale(vec_add(before, losing), -1)) >= 1
        self._above[key] = (used, before, above)
        return above

    def _take_by_share(self, req: Request
                       ) -> tuple[Choice, tuple[str, ...], list[Holding], GivenBack, Admission] | None:
        """A request its team's fair share covers but that fits nowhere (beyond its quota, others
        borrowed the room): on the models where its team is below its share (`below_share`), other
        teams' borrowed shares of teams above theirs (`above_share`), furthest above first, lowest
        priority, newest; with the preemptible work and the team's own lower priorities that any
        preemption may take. Admitted as borrowed (or better) once they are gone. Returns the
        choice, victims, their holdings (released), what the ledger held (refunded), the admission.
        A search that failed is answered from `_no_reclaim` while nothing has changed since."""
        key = _reclaim_key(req)
        if self._no_reclaim.get(key) == self._changes_now():
            return None
        found = self.search_by_share(req)
        if found is None:
            self._no_reclaim[key] = self._changes_now()
        return found

    def _changes_now(self) -> tuple[int, int]:
        # Held nodes as well: the cycle may hold one for a reclaim it was given (`decide(node_hold=True)`).
        return self.changes, int(self.held.sum())

    def search_by_share(self, req: Request
                         ) -> tuple[Choice, tuple[str, ...], list[Holding], GivenBack, Admission] | None:
        amount = demand_of(req)
        models = [m for m in self.models_of(req) if self.below_share(req.team, m, amount)
                  and not self.ledger.verdict(req.team, m, amount, req.priority).never]
        if not models or not self.reclaim_could_admit(req, models):
            return None
        target = req if len(models) == len(self.models_of(req)) else replace(req, gpu_model=frozenset(models))
        among, ranked = self._ranked_by_share(req, models)
        found = find_preemption(self.state, target, self._may_take_by_share, self._rank(req), nodes=self._open_nodes(),
                                among=among, ranked=ranked)
        if found is None:
            return None
        return self._admit_by_share(req, *found)

    def reclaim_could_admit(self, req: Request, models: list[str]) -> bool:
        """False when no victims a reclaim by fair share could find on `models` would leave `req`
        admitted (borrowed or better) once refunded, so that its search cannot end in a reclaim
        (`_admit_by_share` would refuse whatever it found). Victims lie on the GPUs the request
        takes: one GPU for a one-GPU request, one node for more, so what they give back is at most
        what the counted shares that may be taken hold there (`TakeableIndex`, with the team's
        own lower priorities); `Ledger.refund_needed` says what the verdict on the taken GPU's
        model needs given back. In a full cycle most such searches found victims whose refund left
        the request waiting: the room one borrowed share frees goes to the quota its siblings keep."""
        index = self._takeable_index()
        own, own_total = index.own_below(req.team, req.priority)
        demand = demand_of(req)
        whole_node = req.gpu_count > 1
        needed = {}
        for m in models:  # first against the most on one GPU (node) of the model, plus all of the team's own
            most = vec_add(index.most[m][whole_node], own_total)
            thresholds = [t for t in self.ledger.refund_needed(req.team, m, demand) if t is not None]
            if any(vec_le(t, most) for t in thresholds):
                needed[m] = thresholds
        if not needed:
            return False
        state = self.state
        # Whether the counted shares on some GPU (node) could give back enough; then the GPUs
        # (nodes) where the team's own shares add to that, one by one.
        extra: dict[tuple[int, int], Vec] = defaultdict(lambda: ZERO)
        for _, node, gpus, amount in own:
            for j in gpus:
                key = (node, -1 if whole_node else j)
                extra[key] = vec_add(extra[key], amount)
        if not whole_node:  # the few distinct rows of the model's GPUs, then the team's own GPUs
            for m, thresholds in needed.items():
                rows = [row for row, memory in index.slot_rows.get(m, {}).items() if memory >= req.gpu_memory_mib]
                if any(vec_le(t, row) for row in rows for t in thresholds):
                    return True
                model = state.model_id[m]
                for (node, j), more in extra.items():
                    if (state.valid[node, j] and state.ready[node] and state.gpu_model[node, j] == model
                            and state.mem_total[node, j] >= req.gpu_memory_mib):
                        row = vec_add(tuple(index.givable[node, j].tolist()), more)
                        if any(vec_le(t, row) for t in thresholds):
                            return True
            return False
        # One node's usable GPUs, any model: the taken GPU's model is one of them.
        usable = state.valid & state.ready[:, None] & (state.mem_total >= req.gpu_memory_mib)
        enough = (usable & state.model_mask(frozenset(models))).sum(axis=1) >= req.gpu_count
        for m, thresholds in needed.items():
            at = (usable & state.model_mask(frozenset((m,)))).any(axis=1) & enough
            for t in thresholds:
                if ((index.per_node >= np.array(t)).all(axis=-1) & at).any():
                    return True
                for (node, _), more in extra.items():
                    if at[node] and vec_le(t, vec_add(tuple(index.per_node[node].tolist()), more)):
                        return True
        return False

    def _takeable_index(self) -> TakeableIndex:
        if self._takeable is None:
            self._takeable = TakeableIndex(self.state, self.ledger)
        return self._takeable

    def _ranked_by_share(self, req: Request, models: Iterable[str]) -> tuple[list[Holding], dict[str, tuple]]:
        """The shares `_may_take_by_share` lets go on `models`, each with its `_rank`:
        other teams' from `_candidates_on`, the team's own below its priority from `_own_ranked`
        (both kept while nothing changes), with the parts that depend on the taker's priority."""
        team, priority = req.team, req.priority
        among: list[Holding] = []
        ranked: dict[str, tuple] = {}
        self._fresh_candidates()
        for m in models:
            for other in self._takeable_teams(m):
                if other == team:
                    continue  # the team's own: below
                for h, rid, p, kind, first, second in self._candidates_on(m, other):
                    if kind == _OPPORTUNISTIC:
                        if p >= priority:
                            continue
                        ranked[rid] = first
                    elif kind == _BORROWED:
                        ranked[rid] = second if p == 0 < priority else first  # priority 0: `_preemptible`
                    else:
                        ranked[rid] = first
                    among.append(h)
        own, priorities = self._own_ranked(team)
        for h, rid, rank in own[: bisect_left(priorities, priority)]:
            ranked[rid] = rank
            among.append(h)
        return among, ranked

    def _takeable_teams(self, model: str) -> dict[str, list[Holding]]:
        """`TakeableIndex.by_model`'s shares on `model` per team."""
        found = self._by_model_team.get(model)
        if found is None:
            found = self._by_model_team[model] = defaultdict(list)
            for h in self._takeable_index().by_model.get(model, ()):
                found[h.share.team].append(h)
        return found

    def _candidates_on(self, model: str, team: str) -> list[tuple[Holding, str, int, int, tuple, tuple]]:
        """`team`'s shares on `model` that a reclaim by fair share may take for another team
        below its share (`_may_take_by_share`), as (holding, id, priority, kind, rank, rank for a
        taker above priority 0 of a priority-0 borrowed share): kind -1 warned; `_OPPORTUNISTIC`,
        taken only below the taker's priority; `_BORROWED`, of a team that stays at or above its
        share without it. Kept until a decision changes what this reads (`_changed`, applied by
        `_fresh_candidates` before)."""
        by_team = self._candidates.setdefault(model, {})
        found = by_team.get(team)
        if found is not None:
            return found
        found = by_team[team] = []
        placed, claimed, holdings, model_of = self.state.placed, self.claimed, self.ledger.holdings, self._model_of
        for h in self._takeable_teams(model).get(team, ()):
            s = h.share
            rid = s.reservation_id
            if placed.get(rid) is not h or rid in claimed:
                continue
            if s.reclaim_at is not None:
                kind = -1  # warned of a reclaim: it goes anyway
            elif self._protected(s):
                continue
            elif s.admission == Admission.OPPORTUNISTIC:
                kind = _OPPORTUNISTIC
            elif s.admission != Admission.BORROWED:
                continue  # another team's guaranteed work
            else:
                m, entry = model_of.get(rid), holdings.get(rid)
                if m is None or entry is None or not self.above_share(s.team, m, entry[2]):
                    continue
                kind = _BORROWED
            rest = (-self.ledger.saturation(s.team, model_of[rid]), *self._rank_tail(s))
            first = ((-1 if kind == -1 else 0 if kind == _OPPORTUNISTIC else 1), *rest)
            found.append((h, rid, s.priority, kind, first, (0, *rest)))
        return found

    def _own_ranked(self, team: str) -> tuple[list[tuple[Holding, str, tuple]], list[int]]:
        """The team's own running shares a reclaim by fair share may take (below the taker's
        priority), lowest priority first, as (holding, id, rank), and their priorities."""
        self._fresh_candidates()
        found = self._own.get(team)
        if found is None:
            placed, claimed, model_of = self.state.placed, self.claimed, self._model_of
            saturation = self.ledger.saturation
            own = [(h, h.share.reservation_id) for h in self._takeable_index().by_team.get(team, ())]
            own = [(h, rid) for h, rid in own if placed.get(rid) is h and rid not in claimed]
            found = self._own[team] = ([(h, rid, (2, -saturation(team, model_of[rid]), *self._rank_tail(h.share)))
                                        for h, rid in own], [h.share.priority for h, _ in own])
        return found

    def _fresh_candidates(self) -> None:
        if self._stale_all:
            self._candidates.clear()
            self._own.clear()
            self._stale_all = False
        elif self._stale_teams:
            for by_team in self._candidates.values():
                for team in self._stale_teams:
                    by_team.pop(team, None)
            for team in self._stale_teams:
                self._own.pop(team, None)
        self._stale_teams.clear()

    def _rank_tail(self, s: Share) -> tuple:
        tail = self._rank_tails.get(s.reservation_id)
        if tail is None:
            tail = self._rank_tails[s.reservation_id] = (s.priority, -s.since, _newer(s.reservation_id))
        return tail

    def _may_take_by_share(self, share: Share, r: Request) -> bool:
        """What a reclaim by fair share may take (the taker's team is below its share there)."""
        if share.reservation_id in self.claimed:
            return False
        if share.team == r.team:
            return share.priority < r.priority  # within a team, priorities order work
        if share.reclaim_at is not None:
            return True  # warned of a reclaim: it goes anyway
        if self._protected(share):
            return False
        if share.admission == Admission.OPPORTUNISTIC:
            return share.priority < r.priority
        if share.admission != Admission.BORROWED:
            return False  # another team's guaranteed work, whatever its priority
        model, entry = self._model_of.get(share.reservation_id), self.ledger.holdings.get(share.reservation_id)
        return model is not None and entry is not None and self.above_share(share.team, model, entry[2])

    def _admit_by_share(self, req: Request, choice: Choice, victims: tuple[str, ...], released: list[Holding]
                        ) -> tuple[Choice, tuple[str, ...], list[Holding], GivenBack, Admission] | None:
        """Check victims found for a reclaim by fair share together: each victim team stays at or
        above its share without all of them, and without them `req` is admitted (borrowed or better).
        Returns what `_take_by_share` does; else None, with the victims restored."""
        model = self.state.model_at(choice.node, choice.slots[0])
        losing: dict[str, Vec] = defaultdict(lambda: (0, 0, 0))
        for h in released:  # together, too, each victim team stays at or above its share
            s = h.share
            if s.team != req.team and s.admission == Admission.BORROWED and s.reclaim_at is None:
                losing[s.team] = vec_add(losing[s.team], held_by(s, len(h.gpus)))
        given_back = None
        if all(self.above_share(team, model, v) for team, v in losing.items()):
            given_back = self._refund_if_it_makes_room(req, choice, Admission.BORROWED, victims)
        if given_back is None:
            for h in released:
                self.state.restore(h)
            return None
        v = self.ledger.verdict(req.team, model, demand_of(req), req.priority)
        admission = v.admission if v.admission in COUNTED and not v.reclaim else Admission.BORROWED
        return choice, victims, released, given_back, admission

    # ---- holding a node for a multi-GPU request -----------------------------------------------
    def hold(self, req: Request
             ) -> tuple[int, tuple[Choice, tuple[str, ...], Admission, dict[str, float]] | None] | None:
        """For a request for several whole GPUs on one node that fits nowhere, even by preempting
        (the fairest such request of a model only): hold a node of its models for it, so that
        nothing else is placed there this cycle. Taken only: what its admission there lets it evict,
        never another team's guaranteed work (nor work `_protected` from a taker that is not
        guaranteed). The node is the one where its GPUs can be freed now at the least cost (fewest
        victims not already warned, then fewest GPUs they hold): they are reclaimed with their grace.
        Where no node can be, the one where the fewest GPUs hold work it may not take, which it waits
        to end (nothing is evicted before the node can be completed). Returns the node and
        `preempt`'s answer for the first case, None for the second; else None. Each cycle chooses
        again, so a hold moves or ends with the request, and warned victims cost nothing, so it
        stays where it started while it is needed."""
        if req.gpu_count < 2 or not req.whole:
            return None
        amount = demand_of(req)
        options = []
        for m in self.models_of(req):
            if m in self._held_models:
                continue
            v = self.ledger.verdict(req.team, m, amount, req.priority)
            if v.admission == Admission.GUARANTEED and not v.reclaim:
                may, admission = self._may_evict(True), Admission.GUARANTEED
            elif not v.never and self.below_share(req.team, m, amount):
                may, admission = self._may_take_by_share, Admission.BORROWED
            else:
                continue
            target = replace(req, gpu_model=frozenset([m]))
            nodes = np.flatnonzero((self.state.node_model == self.state.model_id[m]) & self.state.ready
                                   & ~self.held & (self.state.gpu_count >= req.gpu_count)).tolist()
            for node in nodes:
                waits = req.gpu_count - int(self.state.gpu_count[node]) + self._blocked(node, target, may)
                tie = int(self.state.tie_rank[node])
                if waits > 0:
                    options.append(((waits, 0, 0.0, tie), node, m, target, may, admission))
                    continue
                found = find_preemption(self.state, target, may, self._rank(req), nodes=[node])
                if found is None:
                    continue
                fresh = [h for h in found[2] if h.share.reclaim_at is None]
                for h in found[2]:
                    self.state.restore(h)
                cost = (0, len(fresh), sum(len(h.gpus) * h.share.gpu_request for h in fresh), tie)
                options.append((cost, node, m, target, may, admission))
        for cost, node, m, target, may, admission in sorted(options, key=lambda o: o[:2]):
            if cost[0] > 0:  # no node can be freed now: keep the one that needs the least time
                self.held[node] = True
                self._held_models.add(m)
                self._changed()
                return node, None
            found = find_preemption(self.state, target, may, self._rank(req), nodes=[node])
            if found is None:
                continue
            choice, victims, released = found
            if admission == Admission.GUARANTEED:
                given_back = self._refund_if_it_makes_room(req, choice, admission, victims)
                if given_back is None:
                    for h in released:
                        self.state.restore(h)
                    continue
            else:
                taken = self._admit_by_share(req, choice, victims, released)
                if taken is None:
                    continue
                _, _, _, given_back, admission = taken
            self._held_models.add(m)
            self._changed()
            decided = self._evict(req, choice, victims, released, given_back, admission)
            if decided[3]:  # its victims have a grace to run out: keep the node for it
                self.held[node] = True
            return node, decided
        return None

    def _blocked(self, node: int, req: Request, may) -> int:
        """GPUs of `node` holding work `req` may not take (or placed this cycle)."""
        on: dict[int, list[Share]] = defaultdict(list)
        for h in self.state.on_node.get(node, {}).values():
            for j in h.gpus:
                on[j].append(h.share)
        reserved = self.state.reserved_now
        return sum(1 for shares in on.values()
                   if any(s.reservation_id in reserved or not may(s, req) for s in shares))


class FairHooks:
    """Fair share for the forecast (`scheduler.core.forecast`): as its gate, the models where quota
    lets a request start; as its order, the cycle's (guaranteed first, then the team furthest below
    its fair share, within a team by priority with aging, then age), as the forecast places and
    ends work. One object serves as both."""

    def __init__(self, snapshot, pending: Sequence[Request], aging_s: float = DEFAULT_AGING_S) -> None:
        assert snapshot.quotas is not None
        state = ClusterState.from_snapshot(snapshot)
        self.fair = Fair(state, snapshot.quotas, pending, snapshot.now, snapshot.past_use, aging_s)
        self.aging_s = aging_s
        self._charged: set[str] = set()

    def allowed(self, req: Request) -> frozenset[str]:
        groups, _, _ = self.fair.verdicts(req)
        return frozenset(m for admission, models in groups.items() if admission is not None for m in models)

    def key(self, req: Request, at: float) -> tuple:
        ledger = self.fair.ledger
        amount = demand_of(req)
        rank, sat = 1, INF
        for m in self.fair.models_of(req):
            verdict = ledger.verdict(req.team, m, amount, req.priority)
            if verdict.admission is None:
                continue
            rank = min(rank, 0 if verdict.admission == Admission.GUARANTEED else 1)
            sat = min(sat, ledger.saturation(req.team, m))
        return (rank, sat, -effective_priority(req, at, self.aging_s), req.created_at, req.id)

    def charge(self, req: Request, model: str) -> None:
        if req.id in self._charged:  # the forecast may call the gate and the order both
            return
        self._charged.add(req.id)
        verdict = self.fair.ledger.verdict(req.team, model, demand_of(req), req.priority)
        self.fair.ledger.charge(req.id, req.team, model, demand_of(req), verdict.admission or Admission.GUARANTEED)

    def refund(self, reservation_id: str) -> None:
        self._charged.discard(reservation_id)
        self.fair.ledger.refund(reservation_id)
