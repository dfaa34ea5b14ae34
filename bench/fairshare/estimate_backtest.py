"""Backtest of the estimated start (issue 23, point 6): the multi-tenant trace replayed through the
engine, the estimate made for every waiting job compared with when it really started.

Method: `scheduler.sim.tenants` generates the trace (departments, teams with Zipf-skewed demand,
`--load` of the fleet's GPU-seconds over `--horizon-h`, interactive jobs with a maximum duration
and batch jobs without one); `scheduler.sim.events` replays it: a cycle (`scheduler.core.decide`,
the portal's engine) every `--cycle-s`, on every arrival and on every end, preempted jobs back in
the queue; arrivals stop at the horizon and the queue then drains. At most every `--estimate-s`,
after a cycle's decisions, each estimator estimates every waiting job:

- forecast: `scheduler.core.forecast.estimate_starts`, the queue in the cycle's order, the known
  ends (an interactive job's reservation expiry) and the known durations (interactive requests'
  maximum);
- kth_end: the portal's rule before issue 23, the k-th waiting job (priority, then age) at the
  k-th earliest known end of any running reservation.

Two more rows are bounds, not estimators anyone could run: the forecast (with the order) given
what the trace knows and the portal cannot, to say how much error each unknown leaves:
- exact_interactive: every interactive job's real end and run time (a perfect run-length model);
- exact_all: every job's real end and run time, batch ones too: what remains is what arrives
  after the estimate (work that ranks ahead, or takes room first) and the preemptions it brings.

Error of an estimate made at time m for a job that next started at s: |estimate - s| / (s - m).
Per estimator: the share of estimates that give a time (and of jobs whose first estimate does),
median and p90 error where one is given, the median signed error (negative: too early), and why
the others have none. Estimates of jobs that had not started when the run stopped are left out
(counted). Time per forecast call is the wall time inside the simulation.

    .venv/bin/python bench/fairshare/estimate_backtest.py   (~5 minutes on 2 shared cores)
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scheduler.core.forecast import Arrivals, Estimate, Expected, QueueOrder, estimate_starts
from scheduler.core.forecast.arrivals import DEFAULT_HORIZON_S, PREFIX
from scheduler.core.forecast.replay import replay_starts
from scheduler.core.model import Request, Snapshot
from scheduler.sim.events import SimResult, Simulation, forecast_estimator, kth_end_estimator, simulate
from scheduler.sim.tenants import HOUR, TenantConfig, generate

OUT = Path(__file__).resolve().parents[1] / "results" / "fairshare"


def errors(result: SimResult, name: str) -> dict:
    """The estimator's error over every estimate it made, and over each job's first estimate."""
    rel, signed, absolute, first_rel = [], [], [], []
    made = given = unstarted = 0
    first_made = first_given = 0
    why_none: Counter[str] = Counter()
    by_code: dict[str, list[float]] = {}
    by_cause: dict[str, list[float]] = {}
    for log in result.jobs.values():
        records = log.estimates.get(name, [])
        for k, (at, start, code) in enumerate(records):
            actual = log.start_after(at)
            if actual is None:
                unstarted += 1
                continue
            made += 1
            # The first estimate of a wait: none earlier since it arrived or was last preempted.
            since = max([log.job.arrival, *(p for p in log.preempted if p <= at)])
            first = k == 0 or records[k - 1][0] < since
            if first:
                first_made += 1
            if start is None:
                why_none[code] += 1
                continue
            given += 1
            waited = actual - at
            e = abs(start - actual) / waited
            rel.append(e)
            signed.append((start - actual) / waited)
            absolute.append(abs(start - actual))
            by_code.setdefault(code, []).append(e)
            by_cause.setdefault(log.causes[log.starts.index(actual)], []).append(e)
            if first:
                first_given += 1
                first_rel.append(e)

    def pct(values, q):
        return round(float(np.percentile(values, q)), 3) if values else None

    return {
        "estimates": made,
        "with_time": given,
        "with_time_pct": round(100 * given / made, 1) if made else None,
        "median_error": pct(rel, 50),
        "p90_error": pct(rel, 90),
        "median_signed_error": pct(signed, 50),
        "median_abs_error_min": round(float(np.median(absolute)) / 60, 1) if absolute else None,
        "within_25pct": round(100 * float(np.mean(np.array(rel) <= 0.25)), 1) if rel else None,
        "first_estimates": first_made,
        "first_with_time_pct": round(100 * first_given / first_made, 1) if first_made else None,
        "first_median_error": pct(first_rel, 50),
        "first_p90_error": pct(first_rel, 90),
        "no_time_because": dict(why_none.most_common()),
        "median_error_by_code": {c: pct(v, 50) for c, v in sorted(by_code.items())},
        # What made room for the start the estimate was about: [estimates, median error].
        "by_start_cause": {c: [len(v), pct(v, 50)] for c, v in sorted(by_cause.items(), key=lambda kv: -len(kv[1]))},
        "left_out_not_started": unstarted,
    }


def timing(result: SimResult, name: str) -> dict:
    calls = result.estimate_s.get(name, [])
    if not calls:
        return {}
    wall = np.array([s for _, s in calls])
    sizes = np.array([n for n, _ in calls])
    return {"calls": len(calls), "median_ms": round(float(np.median(wall)) * 1000, 1),
            "p99_ms": round(float(np.percentile(wall, 99)) * 1000, 1),
            "max_ms": round(float(wall.max()) * 1000, 1), "max_waiting": int(sizes.max()),
            "median_waiting": int(np.median(sizes))}


def exact_estimator(batch_too: bool):
    """The forecast given the real ends and run times (of interactive jobs; with `batch_too`, of all)."""

    def estimate(sim: Simulation, snapshot: Snapshot, queue: list[Request]) -> dict[str, Estimate]:
        ends = {jid: run.ends for jid, run in sim.running.items() if batch_too or run.job.interactive}
        runs = {jid: job.duration for jid, job in sim.waiting.items() if batch_too or job.interactive}
        return estimate_starts(snapshot, queue, ends, now=sim.now, durations=runs,
                               order=QueueOrder(snapshot, sim.aging_s), policy=sim.policy)

    return estimate


def arrivals_seen(sim: Simulation) -> Arrivals:
    """What arrived within the window before now, as the portal learns it: each job's request and,
    where it ended, how long it ran."""
    learnt = Arrivals()
    jobs = sim.trace.jobs
    first = bisect.bisect_left(jobs, sim.now - learnt.window_s, key=lambda j: j.arrival)
    last = bisect.bisect_right(jobs, sim.now, key=lambda j: j.arrival)
    for job in jobs[first:last]:
        log = sim.logs[job.id]
        learnt.observe(job.arrival, job.request(), job.duration if log.ended is not None else None)
    return learnt


def arrivals_estimators(policy: str, *, exact: bool = False, future: bool = False, requeue: bool = False) -> tuple:
    """The forecast with the order, learnt run lengths and the arrivals expected from what arrived
    within the last day (`Arrivals`), twice from one walk: with every start it found, and honest
    (a start that rests mainly on expected arrivals withheld, `ARRIVALS`). With `exact`, every
    running and waiting job's real end and run time instead of the learnt ones (a bound); with
    `future` too, the jobs that really arrive next (a bound: the arrivals known exactly)."""
    made: dict[float, dict[str, Estimate]] = {}

    def honest(sim: Simulation, snapshot: Snapshot, queue: list[Request]) -> dict[str, Estimate]:
        if sim.now in made:
            return made[sim.now]
        made.clear()
        if exact:
            ends = {jid: run.ends for jid, run in sim.running.items()}
            runs = {jid: job.duration for jid, job in sim.waiting.items()}
        else:
            ends, runs = sim.known_ends(sim.run_lengths), sim.known_durations(sim.run_lengths)
        if requeue:  # an evicted job runs its whole run time again
            runs.update({jid: run.job.duration for jid, run in sim.running.items()} if exact else
                        {jid: sim.run_lengths.run(run.job.max_duration) for jid, run in sim.running.items()
                         if run.job.max_duration is not None})
        if future:
            jobs = sim.trace.jobs
            first = bisect.bisect_right(jobs, sim.now, key=lambda j: j.arrival)
            last = bisect.bisect_right(jobs, sim.now + DEFAULT_HORIZON_S, key=lambda j: j.arrival)
            coming = [Expected(j.arrival, replace(j.request(), id=PREFIX + j.id), j.duration) for j in jobs[first:last]]
        else:
            coming = arrivals_seen(sim).forward(sim.now)
        made[sim.now] = estimate_starts(snapshot, queue, ends, now=sim.now, durations=runs,
                                        order=QueueOrder(snapshot, sim.aging_s), policy=policy, arrivals=coming,
                                        arrivals_until=sim.now + DEFAULT_HORIZON_S,
                                        requeue={jid: run.job.request() for jid, run in sim.running.items()}
                                        if requeue else None)
        return made[sim.now]

    def every(sim: Simulation, snapshot: Snapshot, queue: list[Request]) -> dict[str, Estimate]:
        return {rid: e if e.withheld is None else replace(e, start=e.withheld)
                for rid, e in honest(sim, snapshot, queue).items()}

    return every, honest


def engine_estimator(policy: str, *, exact: bool = False, arrivals: str = "", **kw) -> Callable:
    """The forecast by the engine itself (`replay_starts`: `decide` replayed forward, the cycle's
    cadence on the simulation's grid). Ends and run times learnt (`RunLengths`), or with `exact`
    every running and waiting job's real ones (a bound). `arrivals`: "" none, "seen" the work
    expected from what arrived within the last day (`Arrivals`), "future" the jobs that really
    arrive next (a bound). `kw`: more `replay_starts` arguments (`requeue`, `ticks`)."""

    def estimate(sim: Simulation, snapshot: Snapshot, queue: list[Request]) -> dict[str, Estimate]:
        if exact:
            ends = {jid: run.ends for jid, run in sim.running.items()}
            runs = {jid: job.duration for jid, job in sim.waiting.items()}
            runs.update({jid: run.job.duration for jid, run in sim.running.items()})
        else:
            lengths = sim.run_lengths
            ends, runs = sim.known_ends(lengths), sim.known_durations(lengths)
            runs.update({jid: lengths.run(run.job.max_duration) for jid, run in sim.running.items()
                         if run.job.max_duration is not None})
        coming: list[Expected] = []
        if arrivals == "future":
            jobs = sim.trace.jobs
            first = bisect.bisect_right(jobs, sim.now, key=lambda j: j.arrival)
            last = bisect.bisect_right(jobs, sim.now + DEFAULT_HORIZON_S, key=lambda j: j.arrival)
            coming = [Expected(j.arrival, replace(j.request(), id=PREFIX + j.id), j.duration) for j in jobs[first:last]]
        elif arrivals == "seen":
            coming = arrivals_seen(sim).forward(sim.now)
        tick = (math.floor(sim.now / sim.cycle_s + 1e-9) + 1) * sim.cycle_s
        return replay_starts(snapshot, queue, ends, now=sim.now, durations=runs, arrivals=coming, policy=policy,
                             aging_s=sim.aging_s, cycle_s=sim.cycle_s, tick_at=tick,
                             running={jid: run.job.request() for jid, run in sim.running.items()},
                             until=sim.now + DEFAULT_HORIZON_S if coming else None, **kw)

    return estimate


def estimators(policy: str, only: str = "") -> dict:
    arrivals, exact_arrivals, future = (arrivals_estimators(policy), arrivals_estimators(policy, exact=True),
                                        arrivals_estimators(policy, exact=True, future=True))
    made = {"forecast": lambda: forecast_estimator(policy),
            "forecast_order": lambda: forecast_estimator(policy, follow_order=True),
            "forecast_learnt": lambda: forecast_estimator(policy, follow_order=True, learn_run_lengths=True),
            "forecast_arrivals": lambda: arrivals[0],
            "forecast_honest": lambda: arrivals[1],
            "kth_end": lambda: kth_end_estimator,
            "exact_interactive": lambda: exact_estimator(batch_too=False),
            "exact_all": lambda: exact_estimator(batch_too=True),
            "exact_all_arrivals": lambda: exact_arrivals[0],
            "exact_future": lambda: future[0],
            "exact_future_requeue": lambda: arrivals_estimators(policy, exact=True, future=True, requeue=True)[0],
            "forecast_arrivals_requeue": lambda: arrivals_estimators(policy, requeue=True)[0],
            "engine_learnt": lambda: engine_estimator(policy),
            "engine_arrivals": lambda: engine_estimator(policy, arrivals="seen"),
            "engine_exact": lambda: engine_estimator(policy, exact=True),
            "engine_exact_arrivals": lambda: engine_estimator(policy, exact=True, arrivals="seen"),
            "engine_future": lambda: engine_estimator(policy, exact=True, arrivals="future"),
            # The engine's replay with what the walk leaves out left out too: what each costs.
            "engine_future_no_requeue": lambda: engine_estimator(policy, exact=True, arrivals="future",
                                                                 requeue=False),
            "engine_future_no_ticks": lambda: engine_estimator(policy, exact=True, arrivals="future", ticks=False),
            "engine_learnt_no_requeue": lambda: engine_estimator(policy, requeue=False)}
    wanted = only.split(",") if only else list(made)
    return {name: made[name]() for name in wanted}


BOUNDS = ("exact_interactive", "exact_all", "exact_all_arrivals", "exact_future", "exact_future_requeue",
          "engine_exact",
          "engine_exact_arrivals", "engine_future", "engine_future_no_requeue", "engine_future_no_ticks")

# Where the error comes from: the same seed with one source of surprise taken away at a time.
VARIANTS = (
    ("as configured", {}),
    ("interactive jobs run to their expiry", {"early_median": 1.0, "early_sigma": 0.0}),
    ("... and no priority-0 work", {"early_median": 1.0, "early_sigma": 0.0, "opportunistic": 0.0}),
    ("... and every job interactive (every end known)",
     {"early_median": 1.0, "early_sigma": 0.0, "opportunistic": 0.0, "interactive": 1.0}),
)


def run(seed: int, ns: argparse.Namespace, changes: dict | None = None) -> dict:
    settings = {"interactive": ns.interactive, "opportunistic": ns.opportunistic, "early_median": ns.early_median,
                "early_sigma": ns.early_sigma, **(changes or {})}
    cfg = TenantConfig(seed=seed, load=ns.load, horizon_s=ns.horizon_h * HOUR, scale=ns.scale,
                       departments=ns.departments, teams=ns.teams, **settings)
    trace = generate(cfg)
    t0 = time.perf_counter()
    result = simulate(trace, cycle_s=ns.cycle_s, estimate_s=ns.estimate_s, policy=ns.policy,
                      estimators=estimators(ns.policy, ns.estimators))
    wall = time.perf_counter() - t0
    waits = [log.starts[0] - log.job.arrival for log in result.jobs.values() if log.starts]
    return {
        "seed": seed, "changes": changes or {}, "jobs": len(trace.jobs), "gpus": trace.gpus, "nodes": len(trace.nodes),
        "finished": len(result.finished), "sim_hours": round(result.ended_at / HOUR, 1), "cycles": result.cycles,
        "placements": result.placements, "preemptions": result.preemptions,
        "wait_p50_min": round(float(np.percentile(waits, 50)) / 60, 1),
        "wait_p90_min": round(float(np.percentile(waits, 90)) / 60, 1),
        "wall_s": round(wall, 1),
        "estimators": {name: {**errors(result, name), "time": timing(result, name)} for name in result.estimate_s},
    }


def pooled(runs: list[dict], name: str, key: str) -> list:
    return [r["estimators"][name][key] for r in runs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2", help="comma-separated trace seeds")
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument("--horizon-h", type=float, default=48.0)
    parser.add_argument("--scale", type=int, default=1, help="fleet size: every pool's nodes times this")
    parser.add_argument("--departments", type=int, default=3)
    parser.add_argument("--teams", type=int, default=12)
    parser.add_argument("--interactive", type=float, default=0.5, help="share of jobs with a known end")
    parser.add_argument("--opportunistic", type=float, default=0.15, help="share of jobs at priority 0")
    parser.add_argument("--early-median", type=float, default=0.7,
                        help="an interactive job runs this median share of its maximum duration")
    parser.add_argument("--early-sigma", type=float, default=0.5)
    parser.add_argument("--cycle-s", type=float, default=60.0)
    parser.add_argument("--estimate-s", type=float, default=300.0)
    parser.add_argument("--policy", default="tessera")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes")
    parser.add_argument("--out", default="estimate_backtest")
    parser.add_argument("--estimators", default="", help="comma-separated estimators to run (default: all)")
    parser.add_argument("--variants", action="store_true",
                        help="also run the first seed with each source of surprise taken away in turn")
    ns = parser.parse_args()
    seeds = [int(s) for s in ns.seeds.split(",")]
    work = [(s, None) for s in seeds]
    if ns.variants:
        work += [(seeds[0], changes) for _, changes in VARIANTS[1:]]
    if ns.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
            done = list(pool.map(run, [w[0] for w in work], [ns] * len(work), [w[1] for w in work]))
    else:
        done = [run(s, ns, changes) for s, changes in work]
    for r in done:
        print(json.dumps(r), flush=True)
    runs = done[: len(seeds)]
    variants = [done[0], *done[len(seeds):]] if ns.variants else []
    command = "python bench/fairshare/estimate_backtest.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()
    r0 = runs[0]
    lines = [
        "# Estimated start: backtest on a multi-tenant trace replay",
        "",
        f"Command: `{command.strip()}`",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, load average at the end "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (shared with other builds).",
        "",
        f"Trace: {ns.departments} departments, {ns.teams} teams (Zipf-skewed demand), {ns.load:.0%} load over "
        f"{ns.horizon_h:g} h on {r0['nodes']} nodes / {r0['gpus']} GPUs (A100 x8, V100 x4, T4 x2 per node), "
        f"{ns.interactive:.0%} of jobs interactive (known end), the rest batch (no known end); a cycle every "
        f"{ns.cycle_s:g} s and on each arrival and end, estimates at most every {ns.estimate_s:g} s; policy "
        f"{ns.policy}. Seeds {', '.join(map(str, seeds))}; one row per seed.",
        "",
        "| seed | jobs | preemptions | wait p50 / p90 (min) | estimator | estimates | with a time | "
        "median error | p90 error | within 25% | median signed | first estimate: with a time, median, p90 |",
        "| ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in runs:
        for name, e in r["estimators"].items():
            lines.append(
                f"| {r['seed']} | {r['jobs']} | {r['preemptions']} | {r['wait_p50_min']} / {r['wait_p90_min']} "
                f"| {name} | {e['estimates']} | {e['with_time_pct']}% | {e['median_error']} | {e['p90_error']} "
                f"| {e['within_25pct']}% | {e['median_signed_error']} "
                f"| {e['first_with_time_pct']}%, {e['first_median_error']}, {e['first_p90_error']} |")
    names = list(r0["estimators"])

    def spread(name: str) -> tuple[float, float]:
        meds = [r["estimators"][name]["median_error"] for r in runs]
        return min(meds), max(meds)

    real = [n for n in names if n not in BOUNDS]
    best = min(real, key=lambda n: spread(n)[1])
    low, high = spread(best)
    met = high < 0.25
    lines += ["", f"Target (issue 23, point 6): median error under 0.25 where an estimate is given. Best estimator the "
              f"portal can run: {best}, median error {low}-{high} over the seeds, with a time for "
              f"{min(pooled(runs, best, 'with_time_pct'))}-{max(pooled(runs, best, 'with_time_pct'))}% of estimates: "
              f"{'met' if met else 'NOT met'}. "
              + " ".join(f"{n}: {spread(n)[0]}-{spread(n)[1]}." for n in real if n != best)]
    bounds = [n for n in names if n in BOUNDS]
    if bounds:
        lines += ["", "Bounds (the forecast told what the portal cannot know; not estimators): "
                  + " ".join(f"{n}: median error {spread(n)[0]}-{spread(n)[1]}, with a time "
                             f"{min(pooled(runs, n, 'with_time_pct'))}-{max(pooled(runs, n, 'with_time_pct'))}%."
                             for n in bounds)]
    lines += ["", "Median error by what made room for the start (all seeds pooled; estimates with a time):", "",
              "| start came after | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    causes: dict[str, dict[str, list]] = {}
    for r in runs:
        for name in names:
            for cause, (n, med) in r["estimators"][name]["by_start_cause"].items():
                causes.setdefault(cause, {}).setdefault(name, []).append((n, med))
    for cause, per in sorted(causes.items(), key=lambda kv: -sum(n for n, _ in kv[1].get(names[0], []))):
        cells = []
        for name in names:
            vals = per.get(name, [])
            n = sum(v[0] for v in vals)
            med = ", ".join(str(v[1]) for v in vals)
            cells.append(f"{med} (n={n})" if vals else "-")
        lines.append(f"| {cause} | " + " | ".join(cells) + " |")
    if variants:
        lines += ["", f"Where the error comes from (seed {seeds[0]}, one source of surprise taken away at a time; "
                  "median error / share of estimates with a time):", "",
                  "| trace | preemptions | " + " | ".join(names) + " |", "| --- | ---: |" + " ---: |" * len(names)]
        for (label, _), r in zip(VARIANTS, variants, strict=True):
            cells = [f"{r['estimators'][n]['median_error']} / {r['estimators'][n]['with_time_pct']}%" for n in names]
            lines.append(f"| {label} | {r['preemptions']} | " + " | ".join(cells) + " |")
    lines += ["", "Why no time was given (estimates, all seeds):", ""]
    for name in real:
        why: Counter[str] = Counter()
        for r in runs:
            why.update(r["estimators"][name]["no_time_because"])
        lines += [f"- {name}: " + (", ".join(f"{code} {n}" for code, n in why.most_common()) or "always a time")]
    lines += ["", f"Time per call of {best} inside the simulation (wall, ms):", "",
              "| seed | calls | median waiting | max waiting | median ms | p99 ms | max ms |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        t = r["estimators"][best]["time"]
        if t:
            lines.append(f"| {r['seed']} | {t['calls']} | {t['median_waiting']} | {t['max_waiting']} "
                         f"| {t['median_ms']} | {t['p99_ms']} | {t['max_ms']} |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{ns.out}.md").write_text("\n".join(lines) + "\n")
    (OUT / f"{ns.out}.json").write_text(json.dumps({"command": command.strip(), "runs": runs, "variants": variants},
                                                   indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
