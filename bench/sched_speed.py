"""Decision speed of the placement engine at 1x, 4x and 16x the Alibaba cluster (1,213 GPU nodes).

Method: replay the default trace on the real cluster with the policy until `--warm` of capacity
has arrived (a realistic half-full state), copy that state `scale` times (node i of copy k is
node i with a new name), then time `--decisions` further arrivals on the big cluster with full
scoring (every node scored for every pod, caches cold at the start). Prints decisions/s and
latency percentiles per policy and scale, and the cost ratio against 1x measured in the same run.

    .venv/bin/python bench/sched_speed.py   (not under nice: it measures latency; ~2 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core.engine import choose, make_scorer
from scheduler.core.fragmentation import typical_pods
from scheduler.core.model import MILLI, Request
from scheduler.core.state import ClusterState
from scheduler.sim.replay import arrival_order, build_cluster, to_request
from scheduler.sim.trace import DEFAULT_TRACE_DIR, load_nodes, load_pods, resolve_trace

OUT = Path(__file__).resolve().parent / "results" / "scheduler"


def clone(req: Request, uid: str) -> Request:
    return Request(
        id=uid,
        gpu_request=req.gpu_request,
        gpu_count=req.gpu_count,
        gpu_model=req.gpu_model,
        cpu_milli=req.cpu_milli,
        memory_mib=req.memory_mib,
    )


def scaled(state: ClusterState, scale: int, rng: np.random.Generator) -> ClusterState:
    n = len(state.node_names)
    big = ClusterState(
        node_names=[f"{name}-x{k}" for k in range(scale) for name in state.node_names],
        gpu_models=[
            [state.models[m] for m in state.gpu_model[i, : state.gpu_count[i]]]
            for _ in range(scale)
            for i in range(n)
        ],
        gpu_memory_mib=[
            list(state.mem_total[i, : state.gpu_count[i]]) for _ in range(scale) for i in range(n)
        ],
        cpu_milli_free=list(np.tile(state.cpu_free, scale)),
        memory_mib_free=list(np.tile(state.node_mem_free, scale)),
        tie_rank=rng.permutation(n * scale),
    )
    big.free[:] = np.tile(state.free, (scale, 1))
    big.mem_free[:] = np.tile(state.mem_free, (scale, 1))
    return big


def measure(policy: str, scales: list[int], warm: float, decisions: int, seed: int) -> list[dict]:
    pods = load_pods(resolve_trace("default")).rows
    nodes = load_nodes(DEFAULT_TRACE_DIR / "csv" / "openb_node_list_gpu_node.csv").rows
    requests = [to_request(p, p.name) for p in pods]
    typical = typical_pods(requests)
    rng = np.random.default_rng(seed)
    base = build_cluster(nodes, rng)
    capacity = int(base.valid.sum()) * MILLI
    order = arrival_order(pods, capacity, 1.3, rng)
    scorer = make_scorer(policy, base, typical, seed=seed)
    arrived, k = 0, 0
    while arrived < warm * capacity:
        req = clone(requests[order[k]], f"w{k}")
        choice = choose(base, req, scorer)
        if choice is not None:
            base.reserve(req, choice.node, choice.slots)
        arrived += req.total_milli
        k += 1
    rows = []
    for scale in scales:
        state = scaled(base, scale, np.random.default_rng(seed + scale))
        big_scorer = make_scorer(policy, state, typical, seed=seed)
        t0 = time.perf_counter()
        if hasattr(big_scorer, "warm"):
            big_scorer.warm(typical)
        warm_ms = (time.perf_counter() - t0) * 1000
        stream = np.random.default_rng(seed).integers(len(pods), size=decisions)
        timings = []
        placed = 0
        cpu = 0.0
        for j, i in enumerate(stream):
            req = clone(requests[int(i)], f"t{j}")
            t0, c0 = time.perf_counter(), time.thread_time()
            choice = choose(state, req, big_scorer)
            if choice is not None:
                state.reserve(req, choice.node, choice.slots)
            timings.append(time.perf_counter() - t0)
            cpu += time.thread_time() - c0
            placed += choice is not None
        t = np.array(timings)
        rows.append(
            {
                "policy": policy,
                "scale": scale,
                "nodes": len(state.node_names),
                "gpus": int(state.valid.sum()),
                "decisions": decisions,
                "placed": placed,
                "decisions_per_s": round(len(t) / t.sum(), 1),
                "decisions_per_cpu_s": round(len(t) / cpu, 1),
                "p50_ms": round(float(np.percentile(t, 50) * 1000), 3),
                "p99_ms": round(float(np.percentile(t, 99) * 1000), 3),
                "max_ms": round(float(t.max() * 1000), 2),
                "warm_ms": round(warm_ms, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policies", default="tessera,fgd,best-fit")
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--warm", type=float, default=0.6, help="fraction of capacity arrived before timing")
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=42)
    ns = parser.parse_args()
    scales = [int(s) for s in ns.scales.split(",")]
    rows = []
    for policy in ns.policies.split(","):
        rows.extend(measure(policy, scales, ns.warm, ns.decisions, ns.seed))
    command = "python bench/sched_speed.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()
    lines = [
        "# Placement decision speed vs cluster size",
        "",
        f"Command: `{command}`",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (shared with other builds).",
        "",
        f"Each pod scores every node (full scoring). State: the default trace replayed to {ns.warm:.0%} of "
        "capacity on the real cluster, copied `scale` times. FGD/Tessera build the score tables of the "
        "typical shapes first (warm ms, not in the per-decision numbers); other shapes start cold.",
        "",
        "| policy | scale | nodes | GPUs | decisions/s (wall) | decisions/CPU-s | p50 ms | p99 ms | max ms "
        "| warm ms | cost per decision vs 1x (CPU) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        one = next(x for x in rows if x["policy"] == r["policy"] and x["scale"] == scales[0])
        ratio = one["decisions_per_cpu_s"] / r["decisions_per_cpu_s"]
        lines.append(
            f"| {r['policy']} | {r['scale']}x | {r['nodes']} | {r['gpus']} | {r['decisions_per_s']} "
            f"| {r['decisions_per_cpu_s']} "
            f"| {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | {r['warm_ms']} | {ratio:.2f}x |"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sched_speed.md").write_text("\n".join(lines) + "\n")
    (OUT / "sched_speed.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
