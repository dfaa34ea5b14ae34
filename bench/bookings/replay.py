"""Bookings against no bookings and against whole-GPU calendar booking: one multi-tenant trace, the
same engine (issue 24's "Done means").

Method: the trace of bench/fairshare/replay.py (`scheduler.sim.tenants`: 3 departments, 12 teams,
Zipf-skewed demand) under its fair-share quota tree, replayed by `scheduler.sim.events` (a cycle of
`scheduler.core.decide` every `--cycle-s`, on every arrival and every end). About `--booked` (20%)
of the demand (GPU-seconds) is booked ahead: interactive jobs drawn at random (then batch jobs,
booking the hours they need rounded up, once those run out), on the job's model or its team's,
each booking accepted only as the portal's booking check would (its team's quota of that model
holds it beside the team's other bookings over the window: compute and GPUs); the window is the
job's reservation (arrival to arrival + its maximum duration), the job arrives at the
window's start. Three runs, same jobs:

- none: no bookings; the booked jobs are ordinary jobs arriving at their window's start.
- tessera: the bookings go to the engine with each snapshot from `--feed-h` before their start
  (`Snapshot.bookings`, as portal/placement/bookings_feed.py feeds them): their room is held from
  `--lead-s` before the start, in the booking's shape on the GPUs cheapest to clear
  (scheduler/core/clearing.py), the work in the way is warned then (`Reclaim(kind="booking")`:
  borrowed and opportunistic work, the booking team's own, and other teams' guaranteed work only
  where the room exists in total but not on one node) and evicted at the start if still there;
  placement keeps work with a known end after a window off the booked GPUs and backfills the gap
  before it (`Snapshot.durations`: the maximum durations of waiting interactive jobs).
- calendar: the status quo: each booking holds whole GPUs (a 0.25 share books a whole GPU) for
  its whole window, held ahead the same way; the job runs inside it, and what the window holds after
  the job ends (or beside a fraction) is lent to nobody.

Measured (arrival window only for allocation, sampled at every cycle):
- windows honoured: the booked job started within 60 s of its window's start and was not evicted
  before it ended; start delay (first start - window start) p50 / p99 / max.
- GPU allocation %: GPUs really used (fractions as fractions; a calendar booking counts what its job
  uses, not the whole GPUs it holds) / the fleet's GPUs.
- work preempted ahead of windows: jobs warned for a booking that were then evicted (at the window's
  start, or taken by anyone after the warning), and the GPU-hours of work they lost (a job evicted
  runs again from the start).
- evictions in all, wait p50 / p99 of the jobs that were not booked, jobs finished.

    .venv/bin/python bench/bookings/replay.py   (a few minutes on 2 shared cores)
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
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fairshare"))

from replay import Replay, fair_tree  # bench/fairshare/replay.py

from scheduler.core import Reclaim, decide
from scheduler.core.bookings import Booking
from scheduler.sim.tenants import HOUR, TenantConfig, generate

OUT = Path(__file__).resolve().parents[1] / "results" / "bookings"
ON_TIME_S = 60.0


def choose_bookings(trace, tree, share: float, seed: int) -> dict[str, Booking]:
    """Interactive jobs of one model with a priority, at random, booked until `share` of the
    demand is, each accepted only when its team's quota of the model holds it beside the team's
    bookings that overlap its window (compute and GPUs), as the portal's booking check does."""
    rng = np.random.default_rng([seed, 24])
    demand = sum(j.gpu_seconds for j in trace.jobs)
    # A window is the job's reservation (interactive: arrival to its maximum duration); a batch job
    # books the hours it needs, rounded up (its owner knows roughly how long it runs).
    window = {j.id: j.max_duration if j.max_duration is not None else math.ceil(j.duration / HOUR) * HOUR
              for j in trace.jobs}
    candidates = [j for j in trace.jobs if j.max_duration is not None]
    extra = [j for j in trace.jobs if j.max_duration is None]
    per_node = {p.model: p.gpus_per_node for p in trace.config.pools}
    accepted: dict[str, Booking] = {}
    by_team: dict[tuple[str, str], list[Booking]] = defaultdict(list)
    booked = 0.0
    order = [candidates[k] for k in rng.permutation(len(candidates)).tolist()]
    order += [extra[k] for k in rng.permutation(len(extra)).tolist()]
    for job in order:
        if booked >= share * demand:
            break
        model = job.gpu_model or next(t.model for t in trace.teams if t.name == job.team)
        if job.gpu_count > per_node[model]:
            continue  # booked on its team's model, it would fit on no node of it
        quota = tree.units[job.team].quotas.get(model) if job.team in tree.units else None
        if quota is None:
            continue
        b = Booking(job.id, job.team, model, job.gpu_request, job.gpu_memory_mib, job.gpu_count,
                    job.arrival, job.arrival + window[job.id])
        overlapping = [o for o in by_team[(job.team, model)]
                       if o.starts_at < b.ends_at and b.starts_at < o.ends_at]
        # the most the team's bookings hold at once within the window: at some booking's start
        starts = [b.starts_at] + [o.starts_at for o in overlapping if o.starts_at > b.starts_at]
        fits = True
        for t in starts:
            at = [o for o in overlapping if o.starts_at <= t < o.ends_at] + [b]
            milli = sum(round(o.gpu_request * 1000) * o.gpu_count for o in at)
            gpus = sum(o.gpu_count for o in at)
            if milli > quota.milli or gpus > quota.gpus:
                fits = False
                break
        if not fits:
            continue
        accepted[job.id] = b
        by_team[(job.team, model)].append(b)
        booked += job.gpu_seconds
    return accepted


def with_booked_jobs(trace, bookings: dict[str, Booking]):
    """The trace with each booked job asking for its booking's model, at priority 1 at least (a
    booking is guaranteed work), its window its known end: the same jobs in every mode."""
    jobs = tuple(replace(j, gpu_model=bookings[j.id].gpu_model, priority=max(1, j.priority),
                         max_duration=bookings[j.id].ends_at - bookings[j.id].starts_at)
                 if j.id in bookings else j for j in trace.jobs)
    return replace(trace, jobs=jobs)


class BookingReplay(Replay):
    """The fair-share replay with bookings in each snapshot; booking warnings become due times."""

    def __init__(self, trace, tree, bookings: dict[str, Booking], *, feed_s: float, real: dict[str, tuple],
                 **kw) -> None:
        self.bookings = bookings
        self.feed_s = feed_s
        self.real = real  # calendar: job id -> (GPUs it really uses, how long it really runs)
        self.booking_victims: dict[str, float] = {}  # warned for a booking -> when
        self.booking_warnings = 0
        self.lost_ahead: list[tuple[str, float]] = []  # (victim, GPU-hours lost) evicted after a booking warning
        self._leads_seen: set[str] = set()
        super().__init__(trace, tree, tree, sample_s=1e12, **kw)
        self.snapshot_extra = self._extra

    def _extra(self, sim) -> dict:
        now = self.now
        # as the portal feeds them: booked windows of the next hours, and started ones whose job waits
        live = tuple(b for b in self.bookings.values()
                     if now < b.starts_at <= now + self.feed_s
                     or (b.starts_at <= now < b.ends_at and (b.id in self.waiting or b.id in self.running)))
        return {"quotas": self.tree, "bookings": live, "durations": self.known_durations() if live else {}}

    def _on_decision(self, sim, decision) -> None:
        if isinstance(decision, Reclaim) and decision.kind == "booking":
            for victim, when in decision.due.items():
                run = self.running.get(victim)
                if run is None or victim in self.due or when <= self.now:
                    continue
                self.due[victim] = when
                run.share = None
                self.booking_victims[victim] = self.now
                self.booking_warnings += 1
            return
        super()._on_decision(sim, decision)

    def _evict(self, job_id: str) -> None:
        run = self.running.get(job_id)
        if run is not None and job_id in self.booking_victims:
            self.booking_victims.pop(job_id)
            self.lost_ahead.append((job_id, (self.now - run.started) * run.job.gpu_request * run.job.gpu_count / HOUR))
        super()._evict(job_id)

    def _leads_begun(self) -> bool:
        begun = {b.id for b in self.bookings.values() if b.starts_at - b.lead_s <= self.now < b.starts_at}
        new = begun - self._leads_seen
        self._leads_seen |= begun
        return bool(new)

    def cycle(self) -> None:
        if self._leads_begun():
            self._looked = set()  # a window's room is held now: everything is looked at again
            if not self.waiting:  # nobody waits, but the held room may still need its warnings
                for decision in decide(self.snapshot(), [], self.policy, aging_s=self.aging_s):
                    self._on_decision(self, decision)
        super().cycle()
        for victim in [v for v in self.booking_victims if v not in self.running]:
            del self.booking_victims[victim]  # ended on its own (or taken as a Preemption victim: counted there)

    def held_gpus(self) -> dict[str, float]:
        held: dict[str, float] = {}
        for run in self.running.values():
            gpus = run.job.gpu_request * run.job.gpu_count
            if run.job.id in self.real:  # a calendar block: what its job really uses, while it runs
                used, runs_s = self.real[run.job.id]
                gpus = used if self.now < run.started + runs_s else 0.0
            held[run.job.team] = held.get(run.job.team, 0.0) + gpus
        return held


def run_mode(mode: str, trace, tree, bookings: dict[str, Booking], ns) -> dict:
    jobs = trace.jobs
    real: dict[str, tuple] = {}
    feed: dict[str, Booking] = {}
    if mode == "tessera":
        feed = {k: replace(b, lead_s=ns.lead_s) for k, b in bookings.items()}
    elif mode == "calendar":
        changed = []
        for j in jobs:
            b = bookings.get(j.id)
            if b is None:
                changed.append(j)
                continue
            real[j.id] = (j.gpu_request * j.gpu_count, j.duration)
            # the window holds whole GPUs from its start to its end, whatever the job uses of them
            changed.append(replace(j, gpu_request=1.0, gpu_memory_mib=0, duration=b.ends_at - b.starts_at,
                                   max_duration=b.ends_at - b.starts_at))
            feed[j.id] = replace(b, gpu_request=1.0, gpu_memory_mib=0, lead_s=ns.lead_s)
        trace = replace(trace, jobs=tuple(changed))
    t0 = time.perf_counter()
    sim = BookingReplay(trace, tree, feed, feed_s=ns.feed_h * HOUR, real=real, cycle_s=ns.cycle_s, estimators={},
                        until_s=trace.config.horizon_s * 3)
    result = sim.run()
    return measure(sim, result, trace, bookings, mode, time.perf_counter() - t0)


def _pct(xs, q):
    return round(float(np.percentile(xs, q)), 1) if xs else None


def measure(sim: BookingReplay, result, trace, bookings: dict[str, Booking], mode: str, wall: float) -> dict:
    horizon = trace.config.horizon_s
    held = [sum(h.values()) / trace.gpus for t, h in result.samples if t <= horizon]
    delays, honoured = [], 0
    never = 0
    for jid, b in bookings.items():
        log = result.jobs[jid]
        if not log.starts:
            never += 1
            continue
        delay = log.starts[0] - b.starts_at
        delays.append(delay)
        if delay <= ON_TIME_S and not log.preempted:
            honoured += 1
    waits = [log.starts[0] - log.job.arrival for jid, log in result.jobs.items() if jid not in bookings and log.starts]
    evicted = lost = 0.0
    for log in result.jobs.values():
        for t in log.preempted:
            start = max(s for s in log.starts if s <= t)
            evicted += 1
            lost += (t - start) * log.job.gpu_request * log.job.gpu_count / HOUR
    return {
        "windows": len(bookings),
        "windows_honoured_pct": round(100 * honoured / len(bookings), 1) if bookings else None,
        "windows_never_started": never,
        "start_delay_s": {"p50": _pct(delays, 50), "p99": _pct(delays, 99), "max": round(max(delays), 1)
                          if delays else None},
        "allocation_pct": round(100 * float(np.mean(held)), 2) if held else None,
        "booking_warnings": sim.booking_warnings,
        "preempted_ahead_of_windows": len(sim.lost_ahead),
        "gpu_hours_lost_ahead_of_windows": round(sum(x for _, x in sim.lost_ahead), 1),
        "evictions": int(evicted), "gpu_hours_lost_to_evictions": round(lost, 1),
        "wait_not_booked_min": {"p50": _pct([w / 60 for w in waits], 50), "p99": _pct([w / 60 for w in waits], 99)},
        "finished": len(result.finished), "still_waiting": len(result.waiting),
        "cycle_p99_ms": round(float(np.percentile(result.cycle_s, 99)) * 1000, 1) if result.cycle_s else None,
        "wall_s": round(wall, 1),
    }


ROWS = (("windows_honoured_pct", "windows honoured, % (target 100)"),
        ("windows_never_started", "windows whose job never started"),
        ("start_delay_s", "start delay s after the window's start (p50, p99 target < 60, max)"),
        ("allocation_pct", "GPU allocation % (target: within 2 points of none)"),
        ("booking_warnings", "jobs warned ahead of a window"),
        ("preempted_ahead_of_windows", "jobs preempted ahead of windows"),
        ("gpu_hours_lost_ahead_of_windows", "GPU-hours of work they lost"),
        ("evictions", "evictions in all"), ("gpu_hours_lost_to_evictions", "GPU-hours lost to all evictions"),
        ("wait_not_booked_min", "wait of jobs not booked, minutes (p50, p99)"),
        ("finished", "jobs finished"), ("still_waiting", "jobs still waiting at the end"),
        ("cycle_p99_ms", "cycle p99 ms"), ("wall_s", "wall s"))
MODES = ("none", "tessera", "calendar")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--horizon-h", type=float, default=24.0)
    ap.add_argument("--load", type=float, default=1.3)
    ap.add_argument("--booked", type=float, default=0.2, help="share of the demand (GPU-seconds) booked ahead")
    ap.add_argument("--lead-s", type=float, default=900.0, help="warnings this long before a window (the grace)")
    ap.add_argument("--feed-h", type=float, default=12.0, help="bookings reach the engine this long before a window")
    ap.add_argument("--cycle-s", type=float, default=60.0)
    ap.add_argument("--grace-s", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", choices=MODES, help="one mode (while developing: writes nothing)")
    ns = ap.parse_args()
    trace = generate(TenantConfig(seed=ns.seed, departments=3, teams=12, load=ns.load, horizon_s=ns.horizon_h * HOUR))
    tree = fair_tree(trace, ns.grace_s)
    bookings = choose_bookings(trace, tree, ns.booked, ns.seed)
    trace = with_booked_jobs(trace, bookings)
    demand = sum(j.gpu_seconds for j in trace.jobs)
    booked = sum(j.gpu_seconds for j in trace.jobs if j.id in bookings)
    out = {"command": " ".join([".venv/bin/python", *sys.argv]), "seed": ns.seed, "horizon_h": ns.horizon_h,
           "load": ns.load, "jobs": len(trace.jobs), "gpus": trace.gpus, "bookings": len(bookings),
           "booked_share_of_demand_pct": round(100 * booked / demand, 1), "lead_s": ns.lead_s,
           "machine": platform.machine(), "cpus": os.cpu_count(), "modes": {}}
    print(f"{len(trace.jobs)} jobs, {trace.gpus} GPUs, {len(bookings)} bookings = "
          f"{out['booked_share_of_demand_pct']}% of the demand")
    for mode in MODES:
        if ns.only not in (None, mode):
            continue
        got = run_mode(mode, trace, tree, bookings, ns)
        out["modes"][mode] = got
        print(mode, json.dumps(got))
    if ns.only:
        return 0
    none, tess, cal = (out["modes"][m] for m in MODES)
    out["ratios"] = {
        "allocation_tessera_over_none": round(tess["allocation_pct"] / none["allocation_pct"], 3),
        "allocation_tessera_over_calendar": round(tess["allocation_pct"] / cal["allocation_pct"], 3),
        "allocation_points_tessera_minus_none": round(tess["allocation_pct"] - none["allocation_pct"], 2),
        "allocation_points_tessera_minus_calendar": round(tess["allocation_pct"] - cal["allocation_pct"], 2),
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    stem = "replay" if ns.seed == 1 else f"replay-seed{ns.seed}"
    (ns.out / f"{stem}.json").write_text(json.dumps(out, indent=2))
    lines = ["# Bookings: shares booked ahead vs no bookings vs whole-GPU calendar booking\n",
             f"Command: `{out['command']}`\n",
             f"Trace: seed {ns.seed}, {len(trace.jobs)} jobs, {trace.gpus} GPUs, 3 departments, 12 teams, load "
             f"{ns.load}, {ns.horizon_h} h of arrivals; {len(bookings)} bookings, "
             f"{out['booked_share_of_demand_pct']}% of the demand (GPU-seconds), warned {ns.lead_s:.0f} s ahead.\n",
             "| measure | none | tessera | calendar |", "| --- | --- | --- | --- |"]
    for key, label in ROWS:
        lines.append(f"| {label} | {none.get(key)} | {tess.get(key)} | {cal.get(key)} |")
    lines.append("")
    for k, v in out["ratios"].items():
        lines.append(f"- {k.replace('_', ' ')}: {v}")
    (ns.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(out["ratios"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
