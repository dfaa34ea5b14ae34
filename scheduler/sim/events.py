"""A discrete-event simulation of the placement cycle over a multi-tenant trace (scheduler.sim.tenants).

Jobs arrive, wait, are placed by `scheduler.core.decide` (the portal's engine), run for their
duration and end; a preempted job goes back to the queue and runs again from the start when
placed again. A cycle runs every `cycle_s` simulated seconds, on each arrival and on each end (the
portal asks for a cycle on both), over a Snapshot built from what runs then; as the portal's memo
does, a cycle decides only for the jobs it has not looked at since something ended, was evicted or
was placed. After a cycle's decisions are applied, each estimator (by default the forecast,
`scheduler.core.forecast`, as is, following the order, and with learnt run lengths; and the
portal's old k-th-end rule) is asked for the waiting jobs' estimated starts, at most every
`estimate_s`; each job keeps (made at, estimated start, code) per estimator, and the times it
really started and what made room each time, so a backtest can compare them.

Hooks, so that other policies can run the same trace: `snapshot_extra(sim)` returns the extra
Snapshot fields (default: `teams` with each team's flat quota and use; a quota tree goes here as
`quotas=`), `share_extra(run)` the extra Share fields of a running job (e.g. `since`), `order(sim,
snapshot, requests)` the queue order the estimators get (default: the cycle's `queue_order`), and
`on_decision(sim, decision)` sees every decision once it is applied (a placed job's Run is in
`sim.running` then: e.g. keep the placement's admission in `run.extra`), and `decide_extra(sim)`
returns extra keyword arguments for `decide` (e.g. each running job's past evictions).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from scheduler.core import FleetLayout, Node, Placement, Preemption, Request, Share, Snapshot, TeamUsage, decide
from scheduler.core.forecast import Estimate, QueueOrder, RunLengths, estimate_starts
from scheduler.core.queue import DEFAULT_AGING_S, queue_order

from .tenants import Job, TenantTrace


@dataclass
class Run:
    """A job holding GPUs."""

    job: Job
    node: int  # index into the trace's nodes
    gpu_indexes: tuple[int, ...]
    started: float
    ends: float  # when it really ends
    extra: dict[str, Any] = field(default_factory=dict)  # what hooks keep (e.g. admission)
    share: Share | None = None  # its Share, built once (a hook that changes `extra` sets it back to None)

    @property
    def known_end(self) -> float | None:
        """The end the portal knows: the reservation's expiry for an interactive job, else none."""
        return self.started + self.job.max_duration if self.job.max_duration is not None else None


@dataclass
class JobLog:
    job: Job
    starts: list[float] = field(default_factory=list)
    ended: float | None = None  # finished (not preempted)
    preempted: list[float] = field(default_factory=list)
    # Per start, what made room for it: "preempted others", or what ended at that time ("interactive
    # expiry", "interactive early end", "batch end", joined by "+"), or "nothing ended" (room left by
    # an eviction or a start elsewhere, a new order).
    causes: list[str] = field(default_factory=list)
    # estimator name -> [(made at, estimated start or None, code)]
    estimates: dict[str, list[tuple[float, float | None, str]]] = field(default_factory=dict)

    def start_after(self, t: float) -> float | None:
        """Its first start at or after `t` (None: it had not started again when the run stopped)."""
        return next((s for s in self.starts if s >= t), None)


class Estimator(Protocol):
    """Estimated starts of the waiting jobs (`queue`, in the order the cycle admits them) after the
    cycle at `sim.now`; `snapshot` is the cluster then."""

    def __call__(self, sim: Simulation, snapshot: Snapshot, queue: list[Request]) -> Mapping[str, Estimate]: ...


def forecast_estimator(policy: str = "tessera", *, learn_run_lengths: bool = False, follow_order: bool = False,
                       **kw) -> Estimator:
    """`estimate_starts` over what the portal knows: the expiries of running interactive jobs and
    the maximum durations of waiting ones. With `learn_run_lengths`, each expiry becomes the likely
    end that the run lengths of interactive jobs finished so far give (`RunLengths`), and each
    maximum duration the likely run time. With `follow_order`, the forecast keeps the cycle's
    order (`QueueOrder`: priority with aging, then the team's use) up to date as it runs forward,
    instead of the order of the moment."""

    def estimate(sim: Simulation, snapshot: Snapshot, queue: list[Request]) -> Mapping[str, Estimate]:
        lengths = sim.run_lengths if learn_run_lengths else None
        order = QueueOrder(snapshot, sim.aging_s) if follow_order else None
        return estimate_starts(snapshot, queue, sim.known_ends(lengths), now=sim.now, order=order,
                               durations=sim.known_durations(lengths), policy=policy, **kw)

    return estimate


def kth_end(queue: Sequence[Request], ends: Mapping[str, float], now: float) -> dict[str, Estimate]:
    """The portal's rule before issue 23 (portal/placement/queue.py): by priority then age, the k-th
    waiting request starts at the k-th earliest known end of any running reservation."""
    order = sorted(queue, key=lambda r: (-r.priority, r.created_at, r.id))
    known = sorted(ends.values())
    out = {}
    for k, req in enumerate(order):
        if k < len(known):
            out[req.id] = Estimate(max(known[k], now), f"the {k + 1}th known end", "kth_end")
        else:
            out[req.id] = Estimate(None, "fewer known ends than requests ahead", "kth_end")
    return out


def kth_end_estimator(sim: Simulation, snapshot: Snapshot, queue: list[Request]) -> dict[str, Estimate]:
    return kth_end(queue, sim.known_ends(), sim.now)


@dataclass
class SimResult:
    trace: TenantTrace
    jobs: dict[str, JobLog]
    finished: set[str]
    running: set[str]
    waiting: set[str]
    not_arrived: set[str]
    ended_at: float  # simulated time when the run stopped
    cycles: int
    placements: int
    preemptions: int
    cycle_s: list[float]  # wall seconds of each cycle's decide
    estimate_s: dict[str, list[tuple[int, float]]]  # estimator -> [(waiting jobs estimated, wall seconds)]
    samples: list[tuple[float, dict[str, float]]]  # (t, team -> GPUs held) at each cycle


class Simulation:
    def __init__(
        self,
        trace: TenantTrace,
        *,
        policy: str = "tessera",
        cycle_s: float = 60.0,
        cycle_on_arrival: bool = True,
        cycle_on_end: bool = True,
        preemption: bool = True,
        aging_s: float = DEFAULT_AGING_S,
        estimators: Mapping[str, Estimator] | None = None,
        estimate_s: float = 0.0,
        until_s: float | None = None,
        snapshot_extra: Callable[[Simulation], Mapping[str, Any]] | None = None,
        share_extra: Callable[[Run], Mapping[str, Any]] | None = None,
        order: Callable[[Simulation, Snapshot, list[Request]], list[Request]] | None = None,
        on_decision: Callable[[Simulation, object], None] | None = None,
        decide_extra: Callable[[Simulation], Mapping[str, Any]] | None = None,
    ) -> None:
        self.trace = trace
        self.policy = policy
        self.cycle_s = cycle_s
        self.cycle_on_arrival = cycle_on_arrival
        self.cycle_on_end = cycle_on_end
        self.preemption = preemption
        self.aging_s = aging_s
        self.estimators = dict(estimators) if estimators is not None else {
            "forecast": forecast_estimator(policy),
            "forecast_order": forecast_estimator(policy, follow_order=True),
            "forecast_learnt": forecast_estimator(policy, follow_order=True, learn_run_lengths=True),
            "kth_end": kth_end_estimator}
        self.estimate_s = estimate_s
        # After the last arrival the queue drains; stop at the latest at this time.
        self.until_s = until_s if until_s is not None else trace.config.horizon_s * 4
        self.snapshot_extra = snapshot_extra or flat_quota_usage
        self.share_extra = share_extra
        self.order = order or (lambda sim, snap, reqs: queue_order(reqs, snap.teams, snap.now, sim.aging_s))
        self.on_decision = on_decision
        self.decide_extra = decide_extra

        self.nodes = trace.nodes
        self.layout = FleetLayout(self.nodes)
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.logs = {j.id: JobLog(j) for j in trace.jobs}
        self.running: dict[str, Run] = {}
        self.waiting: dict[str, Job] = {}  # in arrival order (dicts keep it)
        self.now = 0.0
        self._end_heap: list[tuple[float, str, int]] = []  # (end, job id, start count: stale if it moved)
        self.cycles = self.placements = self.preemptions = 0
        self.cycle_wall: list[float] = []
        self.estimate_wall: dict[str, list[tuple[int, float]]] = {name: [] for name in self.estimators}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._last_estimate = -float("inf")
        self._cause = "nothing ended"
        self.run_lengths = RunLengths()  # interactive jobs that ended (not preempted): used / reserved
        self._ended_now: list[Run] = []  # ended since the last cycle
        # Waiting jobs a cycle found no room for, since when nothing ended, was evicted or was
        # placed: the next cycle decides only for the others (the same answers: the portal's memo).
        self._looked: set[str] = set()

    # ---- the cluster as the engine sees it ----------------------------------------------------
    def share_of(self, run: Run) -> Share:
        if run.share is None:
            job = run.job
            fields: dict[str, Any] = {"reservation_id": job.id, "gpu_request": job.gpu_request,
                                      "gpu_memory_mib": job.gpu_memory_mib, "priority": job.priority,
                                      "team": job.team}
            if self.share_extra:
                fields.update(self.share_extra(run))
            run.share = Share(**fields)
        return run.share

    def snapshot(self) -> Snapshot:
        by_node: dict[int, list[Run]] = {}
        for run in self.running.values():
            by_node.setdefault(run.node, []).append(run)
        nodes: list[Node] = list(self.nodes)
        for i, runs in by_node.items():
            base = self.nodes[i]
            per_gpu: dict[int, list[Share]] = {}
            for run in runs:
                share = self.share_of(run)
                for g in run.gpu_indexes:
                    per_gpu.setdefault(g, []).append(share)
            cpu = base.cpu_milli_free - sum(r.job.cpu_milli for r in runs) if base.cpu_milli_free is not None else None
            mem = (base.memory_mib_free - sum(r.job.memory_mib for r in runs)
                   if base.memory_mib_free is not None else None)
            nodes[i] = replace(base, cpu_milli_free=cpu, memory_mib_free=mem, gpus=tuple(
                replace(g, shares=tuple(per_gpu[g.index])) if g.index in per_gpu else g for g in base.gpus))
        return Snapshot(nodes=tuple(nodes), now=self.now, layout=self.layout, **self.snapshot_extra(self))

    def held_gpus(self) -> dict[str, float]:
        """GPUs held per team now (a fraction counts as its fraction)."""
        held: dict[str, float] = {}
        for run in self.running.values():
            held[run.job.team] = held.get(run.job.team, 0.0) + run.job.gpu_request * run.job.gpu_count
        return held

    # ---- changes ------------------------------------------------------------------------------
    def _start(self, job: Job, placement: Placement, preempting: bool = False) -> Run:
        run = Run(job, self.node_index[placement.node], tuple(placement.gpu_indexes), self.now,
                  self.now + job.duration)
        self.running[job.id] = run
        del self.waiting[job.id]
        log = self.logs[job.id]
        log.starts.append(self.now)
        log.causes.append("preempted others" if preempting else self._cause)
        heapq.heappush(self._end_heap, (run.ends, job.id, len(log.starts)))
        self.placements += 1
        return run

    def _evict(self, job_id: str) -> None:
        run = self.running.pop(job_id)
        self.logs[job_id].preempted.append(self.now)
        self.waiting[job_id] = run.job  # back in the queue, with its first arrival (Request.created_at)
        self.preemptions += 1

    def _finish_due(self) -> bool:
        ended = False
        while self._end_heap and self._end_heap[0][0] <= self.now:
            _, job_id, nth = heapq.heappop(self._end_heap)
            log = self.logs[job_id]
            if job_id in self.running and len(log.starts) == nth:
                run = self.running.pop(job_id)
                log.ended = self.now
                ended = True
                self._ended_now.append(run)
                if run.job.max_duration is not None:
                    self.run_lengths.observe(self.now - run.started, run.job.max_duration)
        if ended:
            self._looked = set()
        return ended

    def cycle(self) -> None:
        """One placement cycle at `now`, then the estimates (when due)."""
        self.cycles += 1
        kinds = {"batch end" if run.job.max_duration is None else
                 "interactive expiry" if run.ends >= run.known_end - 1e-6 else "interactive early end"
                 for run in self._ended_now}
        self._cause = "+".join(sorted(kinds)) or "nothing ended"
        self._ended_now = []
        fresh = [job for jid, job in self.waiting.items() if jid not in self._looked]
        if fresh:
            snap = self.snapshot()
            requests = [job.request() for job in fresh]
            t0 = time.perf_counter()
            extra = self.decide_extra(self) if self.decide_extra is not None else {}
            decisions = list(decide(snap, requests, self.policy, preemption=self.preemption, aging_s=self.aging_s,
                                    **extra))
            self.cycle_wall.append(time.perf_counter() - t0)
            changed = False
            for decision in decisions:
                if isinstance(decision, Preemption):
                    for victim in decision.victims:
                        if victim in self.running:
                            self._evict(victim)
                    self._start(self.waiting[decision.request_id], decision.placement, preempting=True)
                    changed = True
                elif isinstance(decision, tuple):
                    for placement in decision:
                        self._start(self.waiting[placement.request_id], placement)
                    changed = True
                if self.on_decision is not None:
                    self.on_decision(self, decision)
            self._looked = set() if changed else self._looked | {job.id for job in fresh}
        self.samples.append((self.now, self.held_gpus()))
        if self.waiting and self.estimators and self.now - self._last_estimate >= self.estimate_s:
            self._last_estimate = self.now
            self.estimate()

    def known_ends(self, lengths: RunLengths | None = None) -> dict[str, float]:
        """Running job -> its end as the portal knows it (an interactive job's expiry), or with
        `lengths` its likely end."""
        if lengths is None:
            return {jid: run.known_end for jid, run in self.running.items() if run.known_end is not None}
        return {jid: lengths.end(run.started, run.job.max_duration, self.now)
                for jid, run in self.running.items() if run.job.max_duration is not None}

    def known_durations(self, lengths: RunLengths | None = None) -> dict[str, float]:
        """Waiting job -> how long it runs once started, as far as the portal knows (its maximum)."""
        return {jid: (job.max_duration if lengths is None else lengths.run(job.max_duration))
                for jid, job in self.waiting.items() if job.max_duration is not None}

    def estimate(self) -> None:
        snap = self.snapshot()
        queue = self.order(self, snap, [job.request() for job in self.waiting.values()])
        for name, estimator in self.estimators.items():
            t0 = time.perf_counter()
            out = estimator(self, snap, queue)
            self.estimate_wall[name].append((len(queue), time.perf_counter() - t0))
            for jid in self.waiting:
                e = out.get(jid)
                if e is not None:
                    self.logs[jid].estimates.setdefault(name, []).append((self.now, e.start, e.code))

    # ---- the run ------------------------------------------------------------------------------
    def run(self) -> SimResult:
        jobs = self.trace.jobs
        k = 0  # next arrival
        next_tick = 0.0
        while True:
            nxt = [next_tick]
            if k < len(jobs):
                nxt.append(jobs[k].arrival)
            if self._end_heap:
                nxt.append(self._end_heap[0][0])
            self.now = min(nxt)
            if self.now > self.until_s:
                break
            ended = self._finish_due()
            arrived = False
            while k < len(jobs) and jobs[k].arrival <= self.now:
                self.waiting[jobs[k].id] = jobs[k]
                k += 1
                arrived = True
            tick = self.now >= next_tick
            if tick:
                next_tick = self.now + self.cycle_s
            if tick or (arrived and self.cycle_on_arrival) or (ended and self.cycle_on_end):
                self.cycle()
            if k >= len(jobs) and not self.waiting and not self.running:
                break
        arrived_ids = {j.id for j in jobs[:k]}
        return SimResult(
            trace=self.trace, jobs=self.logs,
            finished={jid for jid, log in self.logs.items() if log.ended is not None},
            running=set(self.running), waiting=set(self.waiting),
            not_arrived={j.id for j in jobs} - arrived_ids, ended_at=self.now, cycles=self.cycles,
            placements=self.placements, preemptions=self.preemptions, cycle_s=self.cycle_wall,
            estimate_s=self.estimate_wall, samples=self.samples,
        )


def flat_quota_usage(sim: Simulation) -> dict[str, Any]:
    """Today's Snapshot extras: each team's flat quota (GPUs) and what it holds, for the queue's order."""
    held = sim.held_gpus()
    return {"teams": {t.name: TeamUsage(t.quota_gpus, held.get(t.name, 0.0)) for t in sim.trace.teams}}


def simulate(trace: TenantTrace, **kw) -> SimResult:
    return Simulation(trace, **kw).run()
