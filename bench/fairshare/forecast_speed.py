"""Speed of the estimated-start forecast (scheduler.core.forecast) at the Alibaba cluster's size.

Method: the Alibaba node list (1,213 GPU nodes, 6,212 GPUs) filled with the default trace's pods
(placed by the engine, in the replay's shuffled order, each of one of 20 teams with priority 0, 1,
2 or 5: 30/40/20/10%) until `--fill` of GPU capacity is held; a part of those running shares
(`--known`) get a known end, spread over the next `--spread-h` hours, the rest none. Then
`--waiting` requests drawn the same way wait (half with a known duration), by priority then age;
`estimate_starts` estimates the first `--limit` of them (guarantee requests may evict priority-0
work and lower priorities of their own team after an end, as the cycle does). Each configuration is timed
`--repeat` times (wall and CPU seconds), the snapshot built once, with and without a FleetLayout
(the portal keeps one per fleet version). With a FleetLayout and preemption, also with the work
expected to arrive (`--arrivals` requests drawn the same way over the last day, each with a
lognormal run time around an hour, as `Arrivals` learns them; the forecast walks what they give
over the next 12 h), against the same configuration without them in the same run.

    .venv/bin/python bench/fairshare/forecast_speed.py   (~1 minute)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scheduler.core import FleetLayout, Gpu, Node, Request, Share, Snapshot
from scheduler.core.engine import choose, make_scorer
from scheduler.core.forecast import Arrivals, estimate_starts
from scheduler.core.forecast.replay import replay_starts
from scheduler.core.fragmentation import typical_pods
from scheduler.core.model import MILLI
from scheduler.sim.replay import MODEL_MEMORY_MIB, arrival_order, build_cluster, to_request
from scheduler.sim.trace import DEFAULT_TRACE_DIR, load_nodes, load_pods, resolve_trace

OUT = Path(__file__).resolve().parents[1] / "results" / "fairshare"


PRIORITIES, PRIORITY_P = (0, 1, 2, 5), (0.3, 0.4, 0.2, 0.1)


def clone(req: Request, uid: str, rng: np.random.Generator, teams: int, **kw) -> Request:
    return Request(id=uid, gpu_request=req.gpu_request, gpu_count=req.gpu_count, gpu_model=req.gpu_model,
                   cpu_milli=req.cpu_milli, memory_mib=req.memory_mib, team=f"team{int(rng.integers(teams))}",
                   priority=int(rng.choice(PRIORITIES, p=PRIORITY_P)), **kw)


def build(fill: float, known: float, spread_h: float, waiting: int, seed: int, teams: int = 20):
    pods = [p for p in load_pods(resolve_trace("default")).rows if p.num_gpu > 0]
    nodes = load_nodes(DEFAULT_TRACE_DIR / "csv" / "openb_node_list_gpu_node.csv").rows
    rng = np.random.default_rng(seed)
    state = build_cluster(nodes, rng)
    requests = [to_request(p, p.name) for p in pods]
    typical = typical_pods(requests)
    scorer = make_scorer("tessera", state, typical)
    capacity = int(state.valid.sum()) * MILLI
    order = arrival_order(pods, capacity, 1.3, rng)
    used, k = 0, 0
    while used < fill * capacity and k < len(order):
        req = clone(requests[order[k]], f"run{k}", rng, teams)
        k += 1
        choice = choose(state, req, scorer)
        if choice is not None:
            state.reserve(req, choice.node, choice.slots)
            used += req.total_milli
    # The state as a snapshot: one Share per GPU a running pod holds.
    per_gpu: dict[tuple[int, int], list[Share]] = {}
    for rec in state.placed.values():
        for j in rec.gpus:
            per_gpu.setdefault((rec.node, j), []).append(rec.share)
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    empty, full = [], []
    for i, n in enumerate(gpu_nodes):
        def gpus(with_shares: bool, i=i, n=n):
            return tuple(Gpu(f"{n.name}/{j}", j, n.model, MODEL_MEMORY_MIB.get(n.model, 32768),
                             shares=tuple(per_gpu.get((i, j), ())) if with_shares else ())
                         for j in range(n.gpus))
        empty.append(Node(n.name, gpus(False), cpu_milli_free=n.cpu_milli, memory_mib_free=n.memory_mib))
        full.append(Node(n.name, gpus(True), cpu_milli_free=int(state.cpu_free[i]),
                         memory_mib_free=int(state.node_mem_free[i])))
    running = sorted(state.placed)
    chosen = rng.choice(len(running), size=int(known * len(running)), replace=False)
    ends = {running[int(c)]: float(rng.uniform(0, spread_h * 3600)) for c in chosen}
    queue = [clone(requests[int(rng.integers(len(requests)))], f"wait{w}", rng, teams, created_at=-float(w))
             for w in range(waiting)]
    queue.sort(key=lambda r: (-r.priority, -r.created_at))  # the cycle's order: priority, then age
    durations = {r.id: float(rng.lognormal(np.log(3600), 1.0)) for r in queue[::2]}
    return empty, full, ends, queue, durations, typical, used / capacity


def history(n: int, seed: int, teams: int = 20) -> Arrivals:
    """`n` requests over the last day (before time 0), drawn as the waiting ones, with run times."""
    pods = [p for p in load_pods(resolve_trace("default")).rows if p.num_gpu > 0]
    requests = [to_request(p, p.name) for p in pods]
    rng = np.random.default_rng([seed, 7])
    learnt = Arrivals()
    for k in range(n):
        at = -float(rng.uniform(0, learnt.window_s))
        req = clone(requests[int(rng.integers(len(requests)))], f"past{k}", rng, teams, created_at=at)
        learnt.observe(at, req, float(rng.lognormal(np.log(3600), 1.0)))
    return learnt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fill", type=float, default=0.95)
    parser.add_argument("--known", type=float, default=0.4, help="share of running reservations with a known end")
    parser.add_argument("--spread-h", type=float, default=24.0)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--limits", default="100,1000,3000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arrivals", type=int, default=2000, help="requests submitted over the last day")
    parser.add_argument("--only-arrivals", action="store_true",
                        help="only the configuration with a FleetLayout and preemption, without and with arrivals")
    parser.add_argument("--engine", action="store_true",
                        help="instead: the forecast by the engine itself (forecast.replay) against the walk, "
                             "with preemption and a FleetLayout, no arrivals, at most --engine-cycles cycles")
    parser.add_argument("--engine-cycles", type=int, default=20)
    ns = parser.parse_args()
    empty, full, ends, queue, durations, _, filled = build(ns.fill, ns.known, ns.spread_h, ns.waiting, ns.seed)
    layout = FleetLayout(empty)
    if ns.engine:
        return engine(ns, Snapshot(tuple(full), now=0.0, layout=layout), ends, queue, durations, filled)
    expected = history(ns.arrivals, ns.seed).forward(0.0)
    rows = []
    configs = [(True, True, 0), (True, True, ns.arrivals)]
    if not ns.only_arrivals:
        configs = [(False, True, 0), *configs, (True, False, 0)]
    for with_layout, preemption, arrivals in configs:
        snap = Snapshot(tuple(full), now=0.0, layout=layout if with_layout else None)
        for limit in [int(x) for x in ns.limits.split(",")]:
            wall, cpu, codes = [], [], Counter()
            for _ in range(ns.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                out = estimate_starts(snap, queue, ends, now=0.0, durations=durations, limit=limit,
                                      preemption=preemption, arrivals=expected if arrivals else ())
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                codes = Counter(e.code for e in out.values())
                codes["by preempting"] = sum("preempting" in e.reason for e in out.values())
            row = {
                "layout": with_layout, "preemption": preemption, "arrivals": arrivals,
                "expected": len(expected) if arrivals else 0, "limit": limit, "waiting": len(queue),
                "running_shares": sum(len(g.shares) for n in full for g in n.gpus), "known_ends": len(ends),
                "nodes": len(full), "gpus": sum(len(n.gpus) for n in full), "filled_pct": round(filled * 100, 1),
                "median_s": round(float(np.median(wall)), 3), "p99_s": round(float(np.percentile(wall, 99)), 3),
                "max_s": round(float(np.max(wall)), 3),
                "median_cpu_s": round(float(np.median(cpu)), 3),
                "codes": dict(sorted(codes.items())),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    command = "python bench/fairshare/forecast_speed.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()
    r0 = rows[0]
    lines = [
        "# Estimated-start forecast: time per call at the Alibaba cluster's size",
        "",
        f"Command: `{command.strip()}`",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, load average at the end "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (shared with other builds).",
        "",
        f"State: {r0['nodes']} nodes, {r0['gpus']} GPUs, {r0['filled_pct']}% of GPU compute held by "
        f"{r0['running_shares']} shares of the default trace's pods; {r0['known_ends']} of the running "
        f"reservations have a known end (uniform over the next {ns.spread_h:g} h), the rest none. "
        f"{r0['waiting']} requests wait (trace shapes, 20 teams, priorities 0/1/2/5, half with a known "
        "duration); the first `limit` are "
        "estimated, the rest answered `behind`. Time per call includes building the cluster state and the "
        f"scorer; median, p99 and max of {ns.repeat} calls.",
        "",
        "| FleetLayout | preemption | arrivals (expected walked) | limit | median s (wall) | p99 s | max s "
        "| median CPU s | answers |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        codes = ", ".join(f"{k} {v}" for k, v in r["codes"].items())
        lines.append(f"| {'yes' if r['layout'] else 'no'} | {'yes' if r['preemption'] else 'no'} "
                     f"| {r['arrivals']} ({r['expected']}) | {r['limit']} | {r['median_s']} | {r['p99_s']} "
                     f"| {r['max_s']} | {r['median_cpu_s']} | {codes} |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "forecast_speed.md").write_text("\n".join(lines) + "\n")
    (OUT / "forecast_speed.json").write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


def engine(ns: argparse.Namespace, snap: Snapshot, ends: dict, queue: list, durations: dict, filled: float) -> int:
    """The engine's replay (`replay_starts`, each cycle a `decide` over the whole queue, as the
    portal's cycle) against the walk (`estimate_starts`) on the same state, in one run."""
    rows = []
    for limit in [int(x) for x in ns.limits.split(",")]:
        for name in ("walk", "engine"):
            wall, cycles, given = [], [], 0
            for _ in range(ns.repeat):
                t0 = time.perf_counter()
                if name == "walk":
                    out = estimate_starts(snap, queue, ends, now=0.0, durations=durations, limit=limit)
                else:
                    out = replay_starts(snap, queue, ends, now=0.0, durations=durations, limit=limit,
                                        max_cycles=ns.engine_cycles)
                wall.append(time.perf_counter() - t0)
                given = sum(1 for e in out.values() if e.start is not None)
                cycles.append(sum(1 for e in out.values() if e.code == "event_budget"))
            row = {"estimator": name, "limit": limit, "waiting": len(queue), "nodes": len(snap.nodes),
                   "median_s": round(float(np.median(wall)), 3), "max_s": round(float(np.max(wall)), 3),
                   "with_time": given, "stopped_by_budget": cycles[-1]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    command = "python bench/fairshare/forecast_speed.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()
    lines = [
        "# Estimated start by the engine itself (forecast.replay) against the walk: time per call",
        "",
        f"Command: `{command.strip()}`",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, load average at the end "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (shared with other builds).",
        "",
        f"State as in `forecast_speed.md`: {len(snap.nodes)} nodes, {filled:.1%} of GPU compute held, "
        f"{len(ends)} known ends, {len(queue)} waiting; FleetLayout, preemption, no arrivals. The replay "
        f"stops after {ns.engine_cycles} cycles (`max_cycles`; those it has not placed by then are answered "
        f"`event_budget`); median and max of {ns.repeat} calls.",
        "",
        "| estimator | limit | median s (wall) | max s | with a time | stopped by the cycle budget | "
        "median time / walk's |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = {r["limit"]: r["median_s"] for r in rows if r["estimator"] == "walk"}
    for r in rows:
        ratio = r["median_s"] / base[r["limit"]] if base[r["limit"]] else float("nan")
        lines.append(f"| {r['estimator']} | {r['limit']} | {r['median_s']} | {r['max_s']} | {r['with_time']} "
                     f"| {r['stopped_by_budget']} | {ratio:.1f}x |")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "forecast_speed_engine.md").write_text("\n".join(lines) + "\n")
    (OUT / "forecast_speed_engine.json").write_text(json.dumps({"command": command.strip(), "rows": rows},
                                                               indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
