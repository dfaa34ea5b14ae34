"""Fair share against today's flat quotas, one multi-tenant trace replayed through the same engine
(issue 23's "Done means"): 3 departments, 12 teams, Zipf-skewed demand, 130% load.

Method: `scheduler.sim.tenants` generates the trace; `scheduler.sim.events` replays it (a cycle of
`scheduler.core.decide` every `--cycle-s`, on every arrival and every end). Two policies, same jobs:

- flat: today's model. Each team one quota for every GPU model (the fleet's GPUs split evenly,
  the trace's `quota_gpus`), as a `*` quota with borrowing limit 0: a guaranteed request beyond it
  waits until the team is back under it (today it was refused and had to be sent again: this is
  the kind reading), priority 0 runs opportunistically beyond it.
- fair: quotas per GPU model (each model's GPUs split evenly among the teams that prefer it), each
  department's row the sum of its teams', borrowing and lending unlimited, weight 1, reclaim grace
  `--grace-s`: beyond its quota a team borrows; a team within its quota reclaims.

Measured (the arrival window only, sampled every `--sample-s`):
- GPU allocation %: GPUs held (fractions as fractions) / the fleet's GPUs.
- received versus deserved, per team and hour while the team has demand: deserved is the fair
  share the engine's formula gives (`Ledger.deserve` on the fair tree, with what runs and waits at
  that moment) for both policies; received is what the team holds (all admissions). Reported: the
  share of team-hours that got at least 95% of their deserved share, the worst team-hour, and
  Jain's index of received/deserved per hour (mean over hours).
- reclaims: a reclaim starts with a request's first `Reclaim` decision and completes when the
  request is placed (its latency: from start to placement), or is given up when a later cycle
  leaves the request waiting without a reclaim (its victims were warned, so they go anyway: the
  portal sent their pods SIGTERM; a warned victim nobody has taken by its `reclaim_at` is evicted
  then, as its pod ends). Node holds (`Reclaim.kind == "node_hold"`) are counted apart too.
- evictions: how many, of priority-0 jobs, most of one job, GPU-hours of work lost (a preempted
  job runs again from the start), preemptions per hour.
- wait (first start − arrival) p50 / p99 per team.
- estimated-start error (fair only): the forecast with fair share as its gate and order
  (`fairqueue.FairHooks`), as bench/fairshare/estimate_backtest.py measures it.

    .venv/bin/python bench/fairshare/replay.py   (~10 minutes on 2 shared cores)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from estimate_backtest import errors

from scheduler.core import BucketQuota, Limits, Preemption, QuotaTree, Reclaim, Unit
from scheduler.core.fairqueue import FairHooks, ledger_of
from scheduler.core.forecast import estimate_starts
from scheduler.core.state import ClusterState
from scheduler.sim.events import Simulation
from scheduler.sim.tenants import HOUR, TenantConfig, generate

OUT = Path(__file__).resolve().parents[1] / "results" / "fairshare"
NO_BORROWING = Limits(0, 0, 0)


def _quota(gpus: float, memory_per_gpu: int, **kw) -> BucketQuota:
    return BucketQuota(round(gpus * 1000), round(gpus * memory_per_gpu), math.ceil(gpus), **kw)


def _memory(trace) -> dict[str, int]:
    return {p.model: p.memory_mib for p in trace.config.pools}


def flat_tree(trace) -> QuotaTree:
    biggest = max(_memory(trace).values())
    return QuotaTree(Unit(t.name, quotas={"*": _quota(t.quota_gpus, biggest, borrowing=NO_BORROWING)})
                     for t in trace.teams)


def fair_tree(trace, grace_s: float) -> QuotaTree:
    models = sorted({g.model for n in trace.nodes for g in n.gpus})
    memory = _memory(trace)
    fans = {m: [t for t in trace.teams if t.model == m] for m in models}
    team_rows: dict[str, dict[str, BucketQuota]] = defaultdict(dict)
    dept_sum: dict[tuple[str, str], float] = defaultdict(float)
    for m, teams in fans.items():
        for t in teams:
            gpus = trace.gpus_of(m) / len(teams)
            team_rows[t.name][m] = _quota(gpus, memory[m])
            dept_sum[(t.department, m)] += gpus
    units = [Unit(f"department:{d.name}", f"department:{d.parent}" if d.parent else "",
                  {m: _quota(g, memory[m]) for (dn, m), g in dept_sum.items() if dn == d.name}, team=False)
             for d in trace.departments]
    units += [Unit(t.name, f"department:{t.department}", team_rows[t.name], reclaim_grace_s=grace_s)
              for t in trace.teams]
    return QuotaTree(units)


class Replay(Simulation):
    """The trace under a quota tree: placements keep their admission, reclaims warn and then
    preempt, and every `sample_s` what each team holds is compared with its fair share."""

    def __init__(self, trace, tree: QuotaTree, ideal: QuotaTree, sample_s: float, node_hold: bool = False,
                 keep_apart: bool = False, **kw) -> None:
        self.tree, self.ideal, self.sample_s = tree, ideal, sample_s
        self.node_hold, self.keep_apart = node_hold, keep_apart
        self.reclaim_started: dict[str, float] = {}
        self.reclaim_latency: list[float] = []  # of reclaims that completed
        self.reclaims_given_up = 0
        self.warned_unused = 0  # warned victims nobody took: evicted at their reclaim_at
        self.held: set[str] = set()  # requests a node was held for
        self.held_placed: set[str] = set()
        self.due: dict[str, float] = {}  # victim -> when it goes
        self.fair_samples: list[tuple[float, dict[str, float], dict[str, float]]] = []  # (t, received, deserved)
        self._next_sample = 0.0
        super().__init__(trace, snapshot_extra=lambda sim: {"quotas": self.tree},
                         share_extra=self._share_extra, on_decision=self._on_decision,
                         decide_extra=self._decide_extra, **kw)

    def _decide_extra(self, sim) -> dict:
        return {"evictions": {jid: self.logs[jid].preempted for jid in self.running if self.logs[jid].preempted},
                "node_hold": self.node_hold,
                "keep_apart": self.keep_apart}

    def _share_extra(self, run) -> dict:
        return {"admission": run.extra.get("admission", "guaranteed"), "since": run.started,
                "reclaim_at": self.due.get(run.job.id)}

    def _on_decision(self, sim, decision) -> None:
        if isinstance(decision, Reclaim):
            if any("holding node" in r.message for r in decision.reasons):
                self.held.add(decision.request_id)
            if not decision.victims:
                return  # a node held while the work it may not take there ends: no reclaim
            self.reclaim_started.setdefault(decision.request_id, self.now)
            for victim, when in decision.due.items():  # the portal warns (SIGTERM) borrowed ones with a grace
                run = self.running.get(victim)
                if run is not None and victim not in self.due and when > self.now and \
                        run.extra.get("admission") == "borrowed":
                    self.due[victim] = when
                    self.running[victim].share = None
            return
        if isinstance(decision, Preemption):
            placements = (decision.placement,)
        elif isinstance(decision, tuple):
            placements = decision
        else:
            if self.reclaim_started.pop(decision.request_id, None) is not None:
                self.reclaims_given_up += 1  # waits without a reclaim now
            return
        for p in placements:
            run = self.running.get(p.request_id)
            if run is not None:
                run.extra["admission"] = p.admission
                run.share = None
            started = self.reclaim_started.pop(p.request_id, None)
            if started is not None:
                self.reclaim_latency.append(self.now - started)
            if p.request_id in self.held:
                self.held_placed.add(p.request_id)
        if isinstance(decision, Preemption):
            for v in decision.victims:
                self.due.pop(v, None)

    def cycle(self) -> None:
        if any(when <= self.now for when in self.due.values()):
            self._looked = set()  # a reclaim came due: look at the waiting ones again
        super().cycle()
        self._looked -= set(self.reclaim_started) | self.held  # waiting for a reclaim or a node: every cycle
        for victim, when in list(self.due.items()):  # warned and not taken: its pod ended on SIGTERM
            if when <= self.now:
                del self.due[victim]
                if victim in self.running:
                    self._evict(victim)
                    self.warned_unused += 1
                    self._looked = set()
        if self.now >= self._next_sample and self.now <= self.trace.config.horizon_s:
            self._next_sample = self.now + self.sample_s
            self._sample()

    def _sample(self) -> None:
        snap = self.snapshot()
        state = ClusterState.from_snapshot(snap)
        ledger = ledger_of(state, self.ideal)
        ledger.deserve([job.request() for job in self.waiting.values()])
        deserved: dict[str, float] = defaultdict(float)
        for (team, _), vec in ledger.deserved.items():
            deserved[team] += vec[0] / 1000
        received: dict[str, float] = defaultdict(float)
        for run in self.running.values():
            received[run.job.team] += run.job.gpu_request * run.job.gpu_count
        self.fair_samples.append((self.now, dict(received), dict(deserved)))


def fair_estimator(sim, snapshot, queue):
    hooks = FairHooks(snapshot, queue, sim.aging_s)
    ordered = sorted(queue, key=lambda r: hooks.key(r, sim.now))
    return estimate_starts(snapshot, ordered, sim.known_ends(), now=sim.now, durations=sim.known_durations(),
                           gate=hooks, order=hooks)


def measure(sim: Replay, result, trace) -> dict:
    horizon = trace.config.horizon_s
    total = trace.gpus
    held = [sum(h.values()) / total for t, h in result.samples if t <= horizon]
    per_team_hour: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for t, received, deserved in sim.fair_samples:
        for team, d in deserved.items():
            if d <= 1e-9:
                continue
            cell = per_team_hour[(team, int(t // HOUR))]
            cell[0] += received.get(team, 0.0)
            cell[1] += d
    ratios = {k: r / d for k, (r, d) in per_team_hour.items() if d > 0}
    by_hour: dict[int, list[float]] = defaultdict(list)
    for (_, hour), x in ratios.items():
        by_hour[hour].append(x)
    jain = [sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) for xs in by_hour.values() if xs and sum(xs) > 0]
    waits: dict[str, list[float]] = defaultdict(list)
    for log in result.jobs.values():
        if log.starts:
            waits[log.job.team].append(log.starts[0] - log.job.arrival)
    hours = result.ended_at / HOUR
    # Evictions and the work they threw away (a preempted job runs again from the start).
    evicted = lost = 0.0
    evicted_p0 = most = 0
    for log in result.jobs.values():
        most = max(most, len(log.preempted))
        for t in log.preempted:
            start = max(s for s in log.starts if s <= t)
            evicted += 1
            evicted_p0 += log.job.priority == 0
            lost += (t - start) * log.job.gpu_request * log.job.gpu_count / HOUR
    worst = min(ratios.items(), key=lambda kv: kv[1]) if ratios else None
    return {
        "allocation_pct": round(100 * float(np.mean(held)), 2) if held else None,
        "team_hours": len(ratios),
        "team_hours_at_95pct_pct": round(100 * sum(1 for x in ratios.values() if x >= 0.95) / len(ratios), 1)
        if ratios else None,
        "worst_team_hour": {"team": worst[0][0], "hour": worst[0][1], "received_over_deserved": round(worst[1], 3)}
        if worst else None,
        "jain_mean": round(float(np.mean(jain)), 3) if jain else None,
        "reclaims": len(sim.reclaim_latency),
        "reclaims_given_up": sim.reclaims_given_up,
        "warned_victims_nobody_took": sim.warned_unused,
        "node_holds": len(sim.held), "node_holds_placed": len(sim.held_placed),
        "reclaim_latency_s": {"p50": round(float(np.median(sim.reclaim_latency)), 1),
                              "p99": round(float(np.percentile(sim.reclaim_latency, 99)), 1)}
        if sim.reclaim_latency else None,
        "preemptions_per_hour": round(result.preemptions / hours, 2) if hours else None,
        "evictions": int(evicted), "evictions_of_priority_0": evicted_p0, "most_evictions_of_one_job": most,
        "gpu_hours_lost_to_evictions": round(lost, 1),
        "wait_min": {team: {"p50": round(float(np.median(w)) / 60, 1),
                            "p99": round(float(np.percentile(w, 99)) / 60, 1)} for team, w in sorted(waits.items())},
        "finished": len(result.finished), "still_waiting": len(result.waiting),
        "cycle_p99_ms": round(float(np.percentile(result.cycle_s, 99)) * 1000, 1) if result.cycle_s else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--horizon-h", type=float, default=24.0)
    ap.add_argument("--load", type=float, default=1.3)
    ap.add_argument("--cycle-s", type=float, default=60.0)
    ap.add_argument("--sample-s", type=float, default=300.0)
    ap.add_argument("--estimate-s", type=float, default=900.0)
    ap.add_argument("--grace-s", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", choices=("flat", "fair"), help="one policy (while developing: writes nothing)")
    ap.add_argument("--no-estimate", action="store_true", help="skip the estimated-start error")
    ap.add_argument("--hold", action="store_true",
                    help="hold a node for multi-GPU requests that fit nowhere (off by default: it doubled evictions)")
    ap.add_argument("--keep-apart", action="store_true",
                    help="place by what nodes hold (scheduler/core/segregation.py; off by default: it added evictions)")
    ns = ap.parse_args()
    trace = generate(TenantConfig(seed=ns.seed, departments=3, teams=12, load=ns.load, horizon_s=ns.horizon_h * HOUR))
    ideal = fair_tree(trace, ns.grace_s)
    out = {"command": " ".join([".venv/bin/python", *sys.argv]), "seed": ns.seed, "horizon_h": ns.horizon_h,
           "load": ns.load, "jobs": len(trace.jobs), "gpus": trace.gpus, "machine": platform.machine(),
           "cpus": os.cpu_count(), "policies": {}}
    for name, tree, estimators in (("flat", flat_tree(trace), {}),
                                   ("fair", ideal, {} if ns.no_estimate else {"forecast": fair_estimator})):
        if ns.only not in (None, name):
            continue
        t0 = time.perf_counter()
        sim = Replay(trace, tree, ideal, ns.sample_s, ns.hold, ns.keep_apart, cycle_s=ns.cycle_s, estimators=estimators,
                     estimate_s=ns.estimate_s, until_s=trace.config.horizon_s * 3)
        result = sim.run()
        got = measure(sim, result, trace)
        if estimators:
            got["estimate"] = errors(result, "forecast")
        got["wall_s"] = round(time.perf_counter() - t0, 1)
        out["policies"][name] = got
        print(name, json.dumps({k: v for k, v in got.items() if k not in ("wait_min",)}, default=str))
    if ns.only:
        return 0
    flat, fair = out["policies"]["flat"], out["policies"]["fair"]
    out["ratios"] = {"allocation_fair_over_flat": round(fair["allocation_pct"] / flat["allocation_pct"], 3)}
    ns.out.mkdir(parents=True, exist_ok=True)
    stem = ("replay" if ns.seed == 1 else f"replay-seed{ns.seed}") + ("-keep-apart" if ns.keep_apart else "")
    (ns.out / f"{stem}.json").write_text(json.dumps(out, indent=2, default=str))
    lines = ["# Fair share vs flat quotas: one trace, same engine\n", f"Command: `{out['command']}`\n",
             f"Trace: seed {ns.seed}, {len(trace.jobs)} jobs, {trace.gpus} GPUs, 3 departments, 12 teams, load "
             f"{ns.load}, {ns.horizon_h} h of arrivals.\n",
             "| measure | flat | fair |", "| --- | --- | --- |"]
    for key, label in (("allocation_pct", "GPU allocation %"), ("team_hours_at_95pct_pct",
                                                                 "team-hours with ≥ 95% of deserved share, %"),
                       ("jain_mean", "Jain's index (mean over hours)"), ("preemptions_per_hour", "preemptions / h"),
                       ("reclaims", "reclaims completed"), ("reclaims_given_up", "reclaims given up"),
                       ("warned_victims_nobody_took", "warned victims nobody took"),
                       ("node_holds", "requests a node was held for"), ("node_holds_placed", "of them placed"),
                       ("evictions", "evictions"),
                       ("evictions_of_priority_0", "evictions of priority-0 jobs"),
                       ("most_evictions_of_one_job", "most evictions of one job"),
                       ("gpu_hours_lost_to_evictions", "GPU-hours of work lost to evictions"),
                       ("finished", "jobs finished"), ("cycle_p99_ms", "cycle p99 ms")):
        lines.append(f"| {label} | {flat.get(key)} | {fair.get(key)} |")
    lines.append(f"| worst team-hour (received/deserved) | {flat['worst_team_hour']} | {fair['worst_team_hour']} |")
    lines.append(f"| reclaim latency s, completed reclaims (p50, p99) | – | {fair['reclaim_latency_s']} |")
    est = fair.get("estimate")
    if est:
        lines.append(f"\nEstimated start (fair, forecast with fair-share gate and order): {est.get('with_time_pct')}% "
                     f"of estimates give a time; median error {est.get('median_error')}, p90 {est.get('p90_error')}.\n")
    lines.append("\nWait per team, minutes (p50 / p99):\n\n| team | flat | fair |\n| --- | --- | --- |")
    for team in sorted(fair["wait_min"]):
        f1, f2 = flat["wait_min"].get(team, {}), fair["wait_min"][team]
        lines.append(f"| {team} | {f1.get('p50')} / {f1.get('p99')} | {f2['p50']} / {f2['p99']} |")
    (ns.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"allocation fair/flat: {out['ratios']['allocation_fair_over_flat']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
