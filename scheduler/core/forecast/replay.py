"""The forecast by the engine itself: the placement cycle (`decide`) replayed forward from the
snapshot over the known ends and the expected arrivals, as the portal would run it.

The walk (walk.py) models the cycle: it is fast at a large queue, but its own rules drift from the
engine's (the order as use changes, which request preempts whom and when, a cycle's cadence), and
with every end and arrival known exactly it still misses the real start by 17-26% (median,
bench/results/fairshare/estimate_backtest.md). Here the decisions are the engine's: each cycle is
`decide` over a Snapshot of the forecast's cluster, its placements, preemptions (the victim waits
again, as itself, and runs its whole run time when placed again) and reclaims (the victim goes at
its due time) applied as the portal applies them. The cycles come as they do in the portal: on
every end and arrival, and every `cycle_s` on the clock's grid (`tick_at`: the first after `now`);
as the portal's memo does, a cycle decides only for the requests it has not looked at since
something ended, was evicted or was placed (the same answers, at a fraction of the cost).

What the forecast does not know stays unknown: a running share without a known end holds its room
throughout, and a request placed without a known run time holds its room from then on.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..cycle import decide
from ..model import Node, Placement, Preemption, Reclaim, Request, Share, Snapshot, TeamUsage
from ..queue import DEFAULT_AGING_S
from ..state import ClusterState, share_of
from .answers import AFTER_ENDS, EVENT_BUDGET, NO_READY_GPU, NOW, UNKNOWN_ENDS, Estimate, behind, capable, names
from .arrivals import Expected

DEFAULT_MAX_CYCLES = 5000  # engine cycles (`decide` calls that decide something) at most


@dataclass
class _Held:
    """A share held in the forecast's cluster."""

    request: Request
    node: int
    gpus: tuple[int, ...]  # GPU indexes (Gpu.index) on the node
    share: Share
    cpu_milli: int
    memory_mib: int
    nth: int  # its placement count: a stale end (it was evicted and placed again) is skipped


class _Cluster:
    """The snapshot's nodes with shares added and removed; a Snapshot of it at any time."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.nodes = list(snapshot.nodes)
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.cpu = [n.cpu_milli_free for n in self.nodes]
        self.memory = [n.memory_mib_free for n in self.nodes]
        self.shares: list[dict[int, list[Share]]] = [
            {g.index: list(g.shares) for g in n.gpus if g.shares} for n in self.nodes]
        self.dirty: set[int] = set()
        self.teams = dict(snapshot.teams)

    def add(self, held: _Held, sign: int) -> None:
        i = held.node
        per = self.shares[i]
        for g in held.gpus:
            if sign > 0:
                per.setdefault(g, []).append(held.share)
            else:
                per[g] = [s for s in per[g] if s.reservation_id != held.share.reservation_id]
        if self.cpu[i] is not None:
            self.cpu[i] -= sign * held.cpu_milli
        if self.memory[i] is not None:
            self.memory[i] -= sign * held.memory_mib
        self.dirty.add(i)
        usage = self.teams.get(held.share.team)
        if usage is not None:  # the queue's team order reads what each team holds (TeamUsage.used_gpus)
            used = usage.used_gpus + sign * held.share.gpu_request * len(held.gpus)
            self.teams[held.share.team] = TeamUsage(usage.quota_gpus, used)

    def mark(self, held: _Held, share: Share) -> None:
        """Replace a held share's Share (a reclaim sets its `reclaim_at`)."""
        per = self.shares[held.node]
        for g in held.gpus:
            per[g] = [share if s.reservation_id == share.reservation_id else s for s in per[g]]
        held.share = share
        self.dirty.add(held.node)

    def at(self, t: float, durations: Mapping[str, float]) -> Snapshot:
        for i in self.dirty:
            base = self.snapshot.nodes[i]
            per = self.shares[i]
            self.nodes[i] = Node(base.name, tuple(replace(g, shares=tuple(per.get(g.index, ()))) for g in base.gpus),
                                 base.labels, base.status, self.cpu[i], self.memory[i])
        self.dirty.clear()
        snap = self.snapshot
        return replace(snap, nodes=tuple(self.nodes), now=t, teams=dict(self.teams),
                       durations={**snap.durations, **durations} if snap.bookings else snap.durations)


def replay_starts(
    snapshot: Snapshot,
    queue: Sequence[Request],
    ends: Mapping[str, float],
    *,
    now: float,
    durations: Mapping[str, float] | None = None,
    arrivals: Sequence[Expected] = (),
    policy: str = "tessera",
    preemption: bool = True,
    aging_s: float = DEFAULT_AGING_S,
    cycle_s: float = 60.0,
    tick_at: float | None = None,
    running: Mapping[str, Request] | None = None,
    evictions: Mapping[str, Sequence[float]] | None = None,
    until: float | None = None,
    limit: int = 1000,
    max_cycles: int = DEFAULT_MAX_CYCLES,
    requeue: bool = True,
    ticks: bool = True,
) -> dict[str, Estimate]:
    """An estimated start for each request of `queue`: when the engine's cycle, replayed forward,
    first places it. `ends`, `durations`, `arrivals`, `policy`, `preemption`, `limit`: as for
    `estimate_starts` (a duration may also be given for a running share: its run time if it is
    evicted and placed again). `aging_s`: the cycle's. `cycle_s`, `tick_at`: the cycle's cadence
    (default: the first tick `cycle_s` after `now`). `running`: the request behind each running
    share, so that an evicted one waits again as itself (default: built from its share: the model
    of its GPU, placed since `Share.since`, no pod CPU or memory). `evictions`: running reservation
    -> when it was evicted before (the cycle's rationing of evictions). `until`: walk no further
    (default: until every request estimated has started or nothing more can change). At most
    `max_cycles` cycles decide something. `requeue=False` (evicted work vanishes) and `ticks=False`
    (cycles only on ends, arrivals and reclaims) leave out what the walk leaves out: to measure
    what each costs the walk. Every request of `queue` gets an Estimate."""
    ids = [r.id for r in queue]
    if len(set(ids)) != len(ids):
        raise ValueError("queue repeats a request id")
    if cycle_s <= 0:
        raise ValueError("cycle_s must be positive")
    durations = dict(durations or {})
    running = running or {}
    out: dict[str, Estimate] = {}
    state = ClusterState.from_snapshot(snapshot)
    wanted: set[str] = set()
    waiting: dict[str, Request] = {}
    for pos, req in enumerate(queue):
        if req.id in state.placed:
            out[req.id] = Estimate(None, "it already holds a share", "invalid")
            continue
        waiting[req.id] = req
        if pos >= limit:
            out[req.id] = behind(limit)
            continue
        count, why = capable(state, req)
        if not count:
            out[req.id] = Estimate(None, why, NO_READY_GPU)
            continue
        wanted.add(req.id)

    cluster = _Cluster(snapshot)
    held: dict[str, _Held] = {}
    seq = itertools.count()
    events: list[tuple[float, int, str, str, int]] = []  # (time, seq, kind, id, nth)
    for rid, rec in state.placed.items():
        share = rec.share
        node = cluster.index[state.node_names[rec.node]]
        gpus = tuple(int(state.gpu_indexes[rec.node][j]) for j in rec.gpus)
        req = running.get(rid) or Request(
            id=rid, team=share.team, gpu_request=share.gpu_request, gpu_memory_mib=share.gpu_memory_mib,
            gpu_count=len(gpus), gpu_model=state.model_at(rec.node, rec.gpus[0]), priority=share.priority,
            affinity=share.affinity, anti_affinity=share.anti_affinity, exclusion=share.exclusion,
            created_at=share.since)
        held[rid] = _Held(req, node, gpus, share, req.cpu_milli if rid in running else 0,
                          req.memory_mib if rid in running else 0, 0)
        if rid in ends:
            heapq.heappush(events, (max(float(ends[rid]), now), next(seq), "end", rid, 0))
        if share.reclaim_at is not None:  # the cycle preempts it then
            heapq.heappush(events, (max(share.reclaim_at, now), next(seq), "due", rid, 0))
    for e in arrivals:
        durations[e.request.id] = e.run_s
        heapq.heappush(events, (max(e.at, now), next(seq), "arrive", e.request.id, 0))
    coming = {e.request.id: e.request for e in arrivals}
    evicted: dict[str, list[float]] = {k: list(v) for k, v in (evictions or {}).items()}
    placements: dict[str, int] = {}
    why: dict[str, str] = {}  # what made room for each start

    def place(p: Placement, t: float, victims: tuple[str, ...] = ()) -> None:
        req = waiting.pop(p.request_id)
        share = replace(share_of(req, p.admission), since=t)
        nth = placements[req.id] = placements.get(req.id, 0) + 1
        h = held[req.id] = _Held(req, cluster.index[p.node], tuple(p.gpu_indexes), share, req.cpu_milli,
                                 req.memory_mib, nth)
        cluster.add(h, +1)
        if req.id in durations:
            heapq.heappush(events, (t + durations[req.id], next(seq), "end", req.id, nth))
        if req.id in wanted and req.id not in out:
            if victims:
                out[req.id] = Estimate(t, f"by preempting {names(list(victims))} (lower priority)", AFTER_ENDS)
            elif ended_now:
                out[req.id] = Estimate(t, f"when {names(ended_now)} end(s)", AFTER_ENDS)
            elif not any_end:
                out[req.id] = Estimate(t, "it fits now: the next cycle places it", NOW)
            else:
                out[req.id] = Estimate(t, "when running reservations end", AFTER_ENDS)

    def release(rid: str) -> _Held:
        h = held.pop(rid)
        cluster.add(h, -1)
        return h

    looked: set[str] = set()
    phase = tick_at if tick_at is not None else now + cycle_s
    next_tick = phase
    cycles = 0
    budget_hit = False
    ended_now: list[str] = []  # what ended just before the cycle deciding now
    any_end = False  # whether anything ended (or was evicted) in the forecast so far
    while any(rid not in out for rid in wanted):
        fresh = [rid for rid in waiting if rid not in looked]
        t = events[0][0] if events else math.inf
        if fresh and ticks:
            t = min(t, next_tick)
        if t == math.inf or (until is not None and t > until):
            break
        if t >= next_tick:
            next_tick = phase + math.floor((t - phase) / cycle_s + 1e-9) * cycle_s
            tick = next_tick >= t - 1e-9
            next_tick += cycle_s
        else:
            tick = False
        ended: list[str] = []
        arrived = due = False
        while events and events[0][0] <= t:
            _, _, kind, rid, nth = heapq.heappop(events)
            if kind == "end":
                h = held.get(rid)
                if h is not None and h.nth == nth:
                    release(rid)
                    ended.append(rid)
            elif kind == "arrive":
                waiting[rid] = coming[rid]
                arrived = True
            elif rid in held:
                due = True
        if ended or due:
            looked = set()
        if not (tick or arrived or ended or due):
            continue
        fresh = [req for rid, req in waiting.items() if rid not in looked]
        if not fresh:
            continue
        if cycles >= max_cycles:
            budget_hit = True
            break
        cycles += 1
        ended_now = ended
        any_end = any_end or bool(ended)
        snap = cluster.at(t, {rid: durations[rid] for rid in waiting if rid in durations})
        extra = {"evictions": evicted} if snapshot.quotas is not None and evicted else {}
        changed = False
        for decision in decide(snap, fresh, policy, preemption=preemption, aging_s=aging_s, **extra):
            if isinstance(decision, Preemption):
                for victim in decision.victims:
                    if victim in held:
                        h = release(victim)
                        any_end = True
                        if requeue:
                            waiting[victim] = h.request
                        evicted.setdefault(victim, []).append(t)
                place(decision.placement, t, decision.victims)
                changed = True
            elif isinstance(decision, tuple):
                for p in decision:
                    place(p, t)
                changed = True
            elif isinstance(decision, Reclaim):
                for victim, at in decision.due.items():
                    h = held.get(victim)
                    if h is not None and (h.share.reclaim_at is None or at < h.share.reclaim_at):
                        cluster.mark(h, replace(h.share, reclaim_at=at))
                        heapq.heappush(events, (max(at, t), next(seq), "due", victim, 0))
        looked = set() if changed else looked | {r.id for r in fresh}

    for rid in wanted:
        if rid in out:
            continue
        if budget_hit:
            out[rid] = Estimate(None, f"no estimate: the forecast stopped after {max_cycles} cycles", EVENT_BUDGET)
        else:
            out[rid] = Estimate(None, "no estimate: the GPUs that could take it are held by reservations without "
                                      "a known end (or by work expected to start before it, whose run time is "
                                      "not known)", UNKNOWN_ENDS)
    return out
