"""Speed of one placement cycle under hierarchical fair share (issue 23's target): 200 teams in a
department tree, 10,000 pending requests, the Alibaba fleet (1,213 GPU nodes, 6,212 GPUs).

Target: p99 < 1 s per decision and >= 3,000 decisions/s.

Method (one run, both engines on the same input):
- The fleet is `scheduler.sim.replay.build_cluster` of the default trace. It is warmed as
  bench/sched_speed.py does (trace pods in the replay's arrival order, placed by the policy) until
  `--warm` of its GPU capacity is held; each warm pod belongs to a team (skewed: a few teams hold
  most) and is admitted by the engine's own ledger (guaranteed, borrowed or opportunistic; a pod
  the ledger would make wait is not placed), so the snapshot holds what a cycle would have left.
- The tree: 3 top-level departments, nested down to level 3 (some with quota rows, some
  transparent), 200 teams with a row per model for the two big models (G2, T4) and a `*` row,
  quotas per model summing to ~95 % of the fleet's capacity, some borrowing and lending limits,
  weights 1-3, a few teams that do not allow over-quota use.
- The queue: 10,000 requests of the trace's shapes (fractional and whole GPUs, 2-8 GPU jobs),
  GPU memory with each, skewed across teams, priorities 0-100, some pinned to models, some pod
  groups (gangs), some with exclusion labels, submitted over the last hour (aging applies).
- `scheduler.core.decide` runs the whole queue with the tree (`Snapshot.quotas`) and without it
  (`quotas=None`: the engine before fair share), alternately `--repeat` times. Per run: decisions
  (what `decide` yields: a placement tuple, a preemption, a reclaim or a refusal) per second of the
  whole cycle, latency per decision (time between consecutive decisions; the first one counts
  from the call and includes building the state and the ledger) p50/p99/max, the whole cycle.
- `--engines fair,flat,fair@aa9af83`: `name@commit` runs scheduler/core as it was at that commit
  (from git) on the same input, as a baseline measured in the same run under the same load; its
  decisions are compared with today's engine's (the table says how many differ).
- The machine is shared: decisions per CPU-second (the cycle's thread time) are reported beside
  decisions per wall second, and the load average at the start and at the end.
- `--profile`: one more fair run under cProfile, the top functions by own and cumulative time.

    .venv/bin/python bench/fairshare/cycle_speed.py      (not under nice: it measures latency)

Results: bench/results/fairshare/cycle_speed.{md,json}.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scheduler.core import (  # noqa: E402
    BucketQuota,
    Gpu,
    Limits,
    Node,
    PodGroup,
    QuotaTree,
    Request,
    Share,
    Snapshot,
    Unit,
    decide,
)
from scheduler.core.engine import choose, make_scorer  # noqa: E402
from scheduler.core.fairqueue import ledger_of  # noqa: E402
from scheduler.core.fairshare import demand_of  # noqa: E402
from scheduler.core.fragmentation import typical_pods  # noqa: E402
from scheduler.core.model import MILLI, NodeStatus  # noqa: E402
from scheduler.core.state import ClusterState  # noqa: E402
from scheduler.sim.replay import arrival_order, build_cluster, to_request  # noqa: E402
from scheduler.sim.trace import DEFAULT_TRACE_DIR, TracePod, load_nodes, load_pods, resolve_trace  # noqa: E402

OUT = ROOT / "bench" / "results" / "fairshare"
GIB = 1024
MEMORY_PER_GPU_MIB = 12 * GIB  # a whole-GPU request's GPU memory; fits every card of the trace (>= 15 GiB)
NOW = 1_000_000.0


# ---- the organisation --------------------------------------------------------------------------
# (department, parent, has quota rows); teams hang under the leaves and some inner departments.
DEPARTMENTS = (
    ("department:research", None, True),
    ("department:research-vision", "department:research", True),
    ("department:research-nlp", "department:research", False),  # transparent: no rows
    ("department:research-nlp-llm", "department:research-nlp", True),
    ("department:product", None, True),
    ("department:product-ads", "department:product", False),
    ("department:product-search", "department:product", True),
    ("department:platform", None, False),
)
HOMES = ("department:research", "department:research-vision", "department:research-nlp",
         "department:research-nlp-llm", "department:product-ads", "department:product-search",
         "department:platform", None)
OWN_ROWS = ("G2", "T4")  # models with their own row at every team; the rest count against `*`


def _team_names(n: int) -> list[str]:
    return [f"team{i:03d}" for i in range(n)]


def demand_weights(n: int, rng: np.random.Generator) -> np.ndarray:
    """Skewed demand: Zipf-like (the busiest team wants ~40x the quietest), in a random order."""
    w = 1.0 / np.arange(1, n + 1) ** 0.8
    return rng.permutation(w / w.sum())


def build_tree(teams: list[str], demand: np.ndarray, capacity: dict[str, tuple], rng: np.random.Generator
               ) -> QuotaTree:
    """Quotas per model summing to ~95 % of capacity, given by the square root of demand (so busy
    teams are beyond their quota and quiet ones lend)."""
    share = np.sqrt(demand)
    share = share / share.sum()
    homes = [HOMES[int(i)] for i in rng.integers(len(HOMES), size=len(teams))]
    rest = tuple(m for m in capacity if m not in OWN_ROWS)
    star_cap = tuple(sum(capacity[m][r] for m in rest) for r in range(3))
    buckets = {m: capacity[m] for m in OWN_ROWS if m in capacity} | {"*": star_cap}

    def row(cap: tuple, f: float, **kw) -> BucketQuota:
        return BucketQuota(int(cap[0] * f), int(cap[1] * f), int(cap[2] * f), **kw)

    units: list[Unit] = []
    sums: dict[str, Counter[str]] = {}
    for t, name in enumerate(teams):
        f = 0.95 * float(share[t])
        quotas = {}
        for bucket, cap in buckets.items():
            borrow = Limits(int(cap[0] * f * 2), None, None) if t % 5 == 0 else Limits()
            lend = Limits(0, 0, 0) if t % 17 == 0 else Limits(int(cap[0] * f / 2), None, None) if t % 7 == 0 \
                else Limits()
            quotas[bucket] = row(cap, f, borrowing=borrow, lending=lend, weight=float(1 + t % 3))
        units.append(Unit(name, homes[t] or "", quotas, allow_over_quota=t % 11 != 0,
                          reclaim_grace_s=float((0, 60, 300)[t % 3])))
        node = homes[t]
        while node is not None:  # a department's rows: the sum of its subtree, plus some slack
            acc = sums.setdefault(node, Counter())
            for bucket in buckets:
                acc[bucket] += f
            node = next(p for d, p, _ in DEPARTMENTS if d == node)
    for name, parent, rows in DEPARTMENTS:
        quotas = {}
        if rows:
            for bucket, cap in buckets.items():
                f = sums.get(name, {}).get(bucket, 0.0)
                quotas[bucket] = row(cap, f, borrowing=Limits(int(cap[0] * 0.15), None, None))
        units.append(Unit(name, parent or "", quotas, team=False))
    return QuotaTree(units)


# ---- the fleet ---------------------------------------------------------------------------------
def _memory_of(milli: int) -> int:
    return max(GIB, round(milli / MILLI * MEMORY_PER_GPU_MIB))


@dataclass
class Fleet:
    state: ClusterState
    capacity: dict[str, tuple]
    shares: dict[tuple[int, int], list[Share]]
    pods: list[TracePod]
    held_milli: int


def warm_fleet(teams: list[str], demand: np.ndarray, tree_for, warm: float, seed: int) -> tuple[Fleet, QuotaTree]:
    pods = load_pods(resolve_trace("default")).rows
    nodes = load_nodes(DEFAULT_TRACE_DIR / "csv" / "openb_node_list_gpu_node.csv").rows
    rng = np.random.default_rng(seed)
    state = build_cluster(nodes, rng)
    empty = ledger_of(state, QuotaTree([]))
    tree = tree_for(empty.capacity)
    ledger = ledger_of(state, tree)
    requests = [to_request(p, p.name) for p in pods]
    scorer = make_scorer("tessera", state, typical_pods(requests), seed=seed)
    capacity = int(state.valid.sum()) * MILLI
    order = arrival_order(pods, capacity, 1.3, rng)
    held = 0
    shares: dict[tuple[int, int], list[Share]] = {}
    pick = np.random.default_rng(seed + 1)
    for k, i in enumerate(order):
        if held >= warm * capacity:
            break
        pod = pods[i]
        if pod.num_gpu == 0:
            continue
        team = teams[int(pick.choice(len(teams), p=demand))]
        priority = int(pick.choice([0, 10, 50, 80]))
        req = Request(f"w{k}", team, pod.gpu_milli / MILLI, gpu_count=pod.num_gpu,
                      gpu_memory_mib=_memory_of(pod.gpu_milli) if pod.num_gpu == 1 else MEMORY_PER_GPU_MIB,
                      priority=priority, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)
        choice = choose(state, req, scorer)
        if choice is None:
            continue
        model = state.models[int(state.gpu_model[choice.node, choice.slots[0]])]
        verdict = ledger.verdict(team, model, demand_of(req), priority)
        if verdict.admission is None or verdict.reclaim:  # waits, or would take back lent quota
            continue
        state.reserve(req, choice.node, choice.slots, admission=str(verdict.admission))
        ledger.charge(req.id, team, model, demand_of(req), verdict.admission)
        since = NOW - float(pick.integers(60, 86_400))
        share = Share(req.id, req.gpu_request, req.gpu_memory_mib, priority, team,
                      admission=str(verdict.admission), since=since)
        for j in choice.slots:
            shares.setdefault((choice.node, j), []).append(share)
        held += req.total_milli
    return Fleet(state, ledger.capacity, shares, pods, held), tree


def snapshot_of(fleet: Fleet, quotas: QuotaTree | None) -> Snapshot:
    st = fleet.state
    nodes = []
    for i, name in enumerate(st.node_names):
        gpus = tuple(Gpu(st.gpu_uuids[i][j], st.gpu_indexes[i][j], st.models[int(st.gpu_model[i, j])],
                         int(st.mem_total[i, j]), shares=tuple(fleet.shares.get((i, j), ())))
                     for j in range(int(st.gpu_count[i])))
        nodes.append(Node(name, gpus, status=NodeStatus.READY, cpu_milli_free=int(st.cpu_free[i]),
                          memory_mib_free=int(st.node_mem_free[i])))
    return Snapshot(tuple(nodes), now=NOW, quotas=quotas)


# ---- the queue ---------------------------------------------------------------------------------
MODEL_CHOICES = (None, None, None, None, None, None, "G2", "T4", "G2|G3", "V100M16|V100M32", "P100|T4")


def queue(n: int, teams: list[str], demand: np.ndarray, pods: list[TracePod], seed: int, exclusion: float
          ) -> list[Request]:
    rng = np.random.default_rng(seed + 2)
    gpu_pods = [p for p in pods if p.num_gpu > 0]
    out: list[Request] = []
    gang = 0
    while len(out) < n:
        team = teams[int(rng.choice(len(teams), p=demand))]
        pod = gpu_pods[int(rng.integers(len(gpu_pods)))]
        priority = int(rng.choice([0, 0, 10, 20, 50, 50, 80, 100]))
        model = MODEL_CHOICES[int(rng.integers(len(MODEL_CHOICES)))]
        labels = frozenset({f"{team}/secure"}) if rng.random() < exclusion else frozenset()
        created = NOW - float(rng.integers(0, 3600))
        common = dict(team=team, gpu_model=model, priority=priority, exclusion=labels, created_at=created,
                      cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)
        if rng.random() < 0.01 and len(out) + 4 <= n:  # a pod group of 2-4 whole GPUs
            size = int(rng.integers(2, 5))
            group = PodGroup(f"gang{gang}", headcount=size)
            gang += 1
            for _ in range(size):
                out.append(Request(f"p{len(out)}", gpu_request=1.0, gpu_memory_mib=MEMORY_PER_GPU_MIB,
                                   group=group, **common))
            continue
        whole = pod.num_gpu > 1
        out.append(Request(f"p{len(out)}", gpu_request=1.0 if whole else pod.gpu_milli / MILLI,
                           gpu_count=pod.num_gpu,
                           gpu_memory_mib=MEMORY_PER_GPU_MIB if whole else _memory_of(pod.gpu_milli), **common))
    return out


# ---- engines -----------------------------------------------------------------------------------
class _TempDirs:
    """What tests' `engine_at` asks of pytest's tmp_path_factory."""

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-"))


def engine_of(name: str):
    """`decide` of an engine name: `fair` or `flat` (today's), or `fair@commit` (scheduler/core at
    that commit, from git: a baseline measured in the same run)."""
    if "@" not in name:
        return decide
    from tests.scheduler.test_fairshare_properties import engine_at
    return engine_at(name.split("@", 1)[1], _TempDirs()).decide


# ---- timing ------------------------------------------------------------------------------------
# Decisions by class name: a baseline engine's classes are its own.
KINDS = {"Preemption": "preemption", "Reclaim": "reclaim", "Unschedulable": "waits"}


def kind(d) -> str:
    return "placed" if isinstance(d, tuple) else KINDS[type(d).__name__]


def run_cycle(snapshot: Snapshot, pending: list[Request], limit_s: float, decide=decide) -> tuple[dict, list]:
    """One cycle over the whole queue; stopped after `limit_s` (then `partial`)."""
    gaps: list[float] = []
    decisions: list = []
    t0 = c0 = time.perf_counter()
    cpu0 = time.thread_time()
    partial = False
    cycle = decide(snapshot, pending)
    for d in cycle:
        t = time.perf_counter()
        gaps.append(t - c0)
        c0 = t
        decisions.append(d)
        if t - t0 > limit_s:
            partial = True
            cycle.close()
            break
    wall = time.perf_counter() - t0
    cpu = time.thread_time() - cpu0
    g = np.array(gaps)
    kinds = Counter(kind(d) for d in decisions)
    admissions = Counter(p.admission for d in decisions if isinstance(d, tuple) for p in d)
    admissions.update(d.placement.admission for d in decisions if kind(d) == "preemption")
    return {
        "partial": partial,
        "decisions": len(decisions),
        "requests_placed": sum(len(d) for d in decisions if isinstance(d, tuple)) + kinds["preemption"],
        "kinds": dict(sorted(kinds.items())),
        "admissions": dict(sorted(admissions.items())),
        "cycle_s": round(wall, 3),
        "cycle_cpu_s": round(cpu, 3),
        "decisions_per_s": round(len(decisions) / wall, 1),
        "decisions_per_cpu_s": round(len(decisions) / cpu, 1),
        "first_ms": round(gaps[0] * 1000, 1),
        "p50_ms": round(float(np.percentile(g, 50)) * 1000, 3),
        "p99_ms": round(float(np.percentile(g, 99)) * 1000, 3),
        "max_ms": round(float(g.max()) * 1000, 1),
    }, decisions


def signature(decisions: list) -> list[tuple]:
    """What a decision sequence decides, for comparing two runs: per decision, its kind, request,
    GPUs and admission (or victims; or the reasons' codes)."""
    out = []
    for d in decisions:
        k = kind(d)
        if k == "placed":
            out.append(("placed", tuple((p.request_id, p.node, p.gpu_uuids, p.admission) for p in d)))
        elif k == "preemption":
            p = d.placement
            out.append(("preempt", d.request_id, d.victims, p.node, p.gpu_uuids, p.admission))
        elif k == "reclaim":
            out.append(("reclaim", d.request_id, d.victims, tuple(sorted(d.due.items()))))
        else:
            out.append(("waits", d.request_id, tuple(str(r.code) for r in d.reasons)))
    return out


def differences(a: list[tuple], b: list[tuple]) -> int:
    """Decisions of `b` that `a` does not make the same (by request; a missing one counts)."""
    by_request = {_request_of(x): x for x in a}
    return sum(by_request.get(_request_of(x)) != x for x in b) + abs(len(a) - len(b))


def _request_of(sig: tuple) -> str:
    return sig[1][0][0] if sig[0] == "placed" else sig[1]


def loop_seconds() -> float:
    """Seconds for a 10M-iteration empty Python loop, best of 3 (as bench/load/run.py prints it)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(10_000_000):
            pass
        best = min(best, time.perf_counter() - t)
    return round(best, 2)


def profile(snapshot: Snapshot, pending: list[Request], top: int) -> dict[str, str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in decide(snapshot, pending):
        pass
    prof.disable()
    out = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
        text = buf.getvalue()
        out[key] = text[text.index("   ncalls"):].rstrip() if "   ncalls" in text else text
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teams", type=int, default=200)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--warm", type=float, default=0.5, help="fraction of GPU capacity held before the cycle")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each engine, alternating")
    parser.add_argument("--exclusion", type=float, default=0.05, help="share of requests with an exclusion label")
    parser.add_argument("--limit-s", type=float, default=1800.0,
                        help="stop a cycle after this long (reported as partial: the old engine's preemption "
                             "search can take hours on this queue)")
    parser.add_argument("--engines", default="fair,flat",
                        help="fair, flat, and baselines as fair@COMMIT or flat@COMMIT (scheduler/core at COMMIT)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--profile", action="store_true", help="one more fair run under cProfile")
    parser.add_argument("--name", default="cycle_speed", help="results file name (without extension)")
    parser.add_argument("--note", default="", help="a line for the results (how the machine was shared)")
    ns = parser.parse_args()

    rng = np.random.default_rng(ns.seed)
    teams = _team_names(ns.teams)
    demand = demand_weights(ns.teams, rng)
    fleet, tree = warm_fleet(teams, demand, lambda cap: build_tree(teams, demand, cap, rng), ns.warm, ns.seed)
    pending = queue(ns.pending, teams, demand, fleet.pods, ns.seed, ns.exclusion)
    fair_snap, flat_snap = snapshot_of(fleet, tree), snapshot_of(fleet, None)
    held = Counter(s.admission for ss in fleet.shares.values() for s in ss)
    setup = {
        "nodes": len(fleet.state.node_names), "gpus": int(fleet.state.valid.sum()),
        "held_pct": round(fleet.held_milli / (int(fleet.state.valid.sum()) * MILLI) * 100, 1),
        "held_shares_by_admission": dict(sorted(held.items())),
        "teams": ns.teams, "departments": len(DEPARTMENTS), "pending": len(pending),
        "gang_members": sum(r.group is not None for r in pending),
        "with_exclusion": sum(bool(r.exclusion) for r in pending),
        "pinned_to_models": sum(r.gpu_model is not None for r in pending),
        "multi_gpu": sum(r.gpu_count > 1 for r in pending),
        "fractional": sum(r.gpu_count == 1 and not r.whole for r in pending),
        "priority_0": sum(r.priority == 0 for r in pending),
    }
    print(json.dumps(setup), flush=True)

    engines = ns.engines.split(",")
    snaps = {"fair": fair_snap, "flat": flat_snap}
    decides = {name: engine_of(name) for name in engines}
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    sigs: dict[str, list] = {}
    for k in range(ns.repeat):
        for name in engines if k % 2 == 0 else engines[::-1]:
            row, decisions = run_cycle(snaps[name.split("@")[0]], pending, ns.limit_s, decides[name])
            sig = signature(decisions)
            if name in sigs and not row["partial"] and sigs[name] != sig:
                raise SystemExit(f"{name}: run {k} decided differently from run 0")
            sigs[name] = sig
            runs[name].append(row)
            print(json.dumps({"engine": name, "run": k, **row}), flush=True)

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[name]), 3)

    keys = ("decisions", "decisions_per_s", "decisions_per_cpu_s", "cycle_s", "cycle_cpu_s", "first_ms", "p50_ms",
            "p99_ms", "max_ms")
    summary = {name: {k: median(name, k) for k in keys} | {"partial": any(r["partial"] for r in runs[name])}
               for name in runs}
    # A baseline's decisions against today's engine's on the same snapshot (complete runs only).
    for name in runs:
        today = name.split("@")[0]
        if "@" in name and today in sigs and not summary[name]["partial"] and not summary[today]["partial"]:
            summary[name]["decisions_differing"] = differences(sigs[today], sigs[name])
    ratio = {}
    if "fair" in summary and "flat" in summary:
        ratio = {k: round(summary["fair"][k] / summary["flat"][k], 3) for k in ("decisions_per_s", "cycle_cpu_s")}
    target = {}
    if "fair" in summary:
        target = {"p99_below_1_s": summary["fair"]["p99_ms"] < 1000,
                  "at_least_3000_decisions_per_s": summary["fair"]["decisions_per_s"] >= 3000,
                  "at_least_3000_decisions_per_cpu_s": summary["fair"]["decisions_per_cpu_s"] >= 3000}
    prof = profile(fair_snap, pending, 25) if ns.profile else {}
    command = "python bench/fairshare/cycle_speed.py " + shlex.join(sys.argv[1:])
    load = os.getloadavg()
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python "
               f"{platform.python_version()}; a 10M-iteration Python loop in {loop_seconds()} s; "
               f"load average at the start {load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f}, "
               f"at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    result = {"command": command, "machine": machine, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
              "note": ns.note, "seed": ns.seed, "warm": ns.warm, "limit_s": ns.limit_s, "setup": setup,
              "runs": runs, "median": summary, "fair_over_flat": ratio, "target_met": target, "profile": prof}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{ns.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (OUT / f"{ns.name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    s, m = r["setup"], r["median"]
    lines = [
        f"# One placement cycle under fair share: {s['teams']} teams, {s['pending']:,} pending, "
        f"{s['nodes']:,} nodes",
        "",
        f"Command: `{r['command']}`  ",
        f"Machine: {r['machine']}  ",
        f"Date: {r['date']} UTC" + (f"  \nNote: {r['note']}" if r["note"] else ""),
        "",
        f"Fleet: {s['nodes']} nodes, {s['gpus']} GPUs, {s['held_pct']} % of GPU capacity held by "
        f"{sum(s['held_shares_by_admission'].values())} shares "
        f"({', '.join(f'{k} {v}' for k, v in s['held_shares_by_admission'].items())}). "
        f"Tree: {s['departments']} departments, {s['teams']} teams. Queue: {s['pending']} requests "
        f"({s['fractional']} fractional, {s['multi_gpu']} multi-GPU, {s['gang_members']} in pod groups, "
        f"{s['pinned_to_models']} pinned to models, {s['with_exclusion']} with an exclusion label, "
        f"{s['priority_0']} at priority 0).",
        "",
        "`fair`: `decide` with the tree (`Snapshot.quotas`); `flat`: the same snapshot and queue without it "
        "(the engine before fair share). Median of the runs; latency is the time between consecutive "
        "decisions, the first counted from the call (state, scorer, ledger and deserved shares). A run "
        f"still going after {r['limit_s']:.0f} s is stopped there (partial: its numbers cover the decisions "
        "made until then, the cycle's easiest part: the placements come first).",
        "",
        "| engine | decisions | decisions/s | decisions per CPU s | cycle s | cycle CPU s | first decision ms "
        "| p50 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, x in m.items():
        lines.append(f"| {name}{' (partial)' if x['partial'] else ''} | {x['decisions']:.0f} | {x['decisions_per_s']} "
                     f"| {x.get('decisions_per_cpu_s', '')} | {x['cycle_s']} | {x['cycle_cpu_s']} | {x['first_ms']} "
                     f"| {x['p50_ms']} | {x['p99_ms']} | {x['max_ms']} |")
    for name, x in m.items():
        if "decisions_differing" in x:
            today = name.split("@")[0]
            lines.append(f"\n`{name}` against `{today}`: {x['decisions_differing']} of {x['decisions']:.0f} decisions "
                         "differ (placement, victims, due times or reason codes).")
    ratio, t = r["fair_over_flat"], r["target_met"]
    lines.append("")
    if ratio:
        lines.append(f"fair / flat: decisions/s {ratio['decisions_per_s']}x, CPU per cycle {ratio['cycle_cpu_s']}x"
                     + (" (flat partial)" if m["flat"]["partial"] else "") + ".  ")
    if t:
        lines.append(f"Target (fair): p99 < 1 s: {'met' if t['p99_below_1_s'] else 'NOT met'}; >= 3,000 decisions/s: "
                     f"{'met' if t['at_least_3000_decisions_per_s'] else 'NOT met'} (per CPU-second: "
                     f"{'met' if t.get('at_least_3000_decisions_per_cpu_s') else 'NOT met'}).")
    lines += [
        "",
        "What each engine decided (first run):",
        "",
        "| engine | decisions | placed | preemptions | reclaims | waits | placed by admission |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, rows in r["runs"].items():
        x = rows[0]
        k = x["kinds"]
        lines.append(f"| {name} | {x['decisions']} | {x['requests_placed']} | {k.get('preemption', 0)} "
                     f"| {k.get('reclaim', 0)} | {k.get('waits', 0)} "
                     f"| {', '.join(f'{a} {n}' for a, n in x['admissions'].items())} |")
    if any(len(rows) > 1 for rows in r["runs"].values()):
        lines += ["", "All runs:", "",
                  "| engine | run | decisions/s | decisions per CPU s | cycle s | cycle CPU s | p50 ms | p99 ms "
                  "| max ms |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name, rows in r["runs"].items():
            for i, x in enumerate(rows):
                lines.append(f"| {name} | {i} | {x['decisions_per_s']} | {x.get('decisions_per_cpu_s', '')} "
                             f"| {x['cycle_s']} | {x['cycle_cpu_s']} | {x['p50_ms']} | {x['p99_ms']} | {x['max_ms']} |")
    if r["profile"]:
        lines += ["", "## Profile of one fair cycle (cProfile, own time)", "", "```",
                  r["profile"]["tottime"], "```", "", "Cumulative:", "", "```", r["profile"]["cumulative"], "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
