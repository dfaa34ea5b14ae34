"""`python -m scheduler.sim replay|compare`: trace replay tables, JSON, and the comparison plot."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from scheduler.core.engine import POLICIES

from .reference import mean_at, published
from .replay import RunResult, replay
from .trace import DEFAULT_TRACE_DIR, TraceError, load_nodes, load_pods, resolve_trace

POINTS = (100, 130)
DEFAULT_NODES = DEFAULT_TRACE_DIR / "csv" / "openb_node_list_gpu_node.csv"


def parse_seeds(text: str) -> list[int]:
    """'42-51', '42,45' or '42'."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                seeds.extend(range(int(lo), int(hi) + 1))
            elif part.strip():
                seeds.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must look like 42-51 or 42,43: {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return seeds


def trace_label(trace: str) -> str:
    path = Path(trace)
    return path.stem.removeprefix("openb_pod_list_") if path.suffix == ".csv" else trace


def _load(trace: str, nodes: Path):
    pods = load_pods(resolve_trace(trace))
    node_rows = load_nodes(nodes)
    problems = pods.problems + node_rows.problems
    for line in problems[:20]:
        print(f"skipped bad row: {line}", file=sys.stderr)
    if len(problems) > 20:
        print(f"... and {len(problems) - 20} more bad rows", file=sys.stderr)
    if not pods.rows:
        raise TraceError(f"trace {trace} has no usable pods")
    if not any(n.gpus > 0 for n in node_rows.rows):
        raise TraceError(f"node list {nodes} has no usable GPU nodes")
    return pods.rows, node_rows.rows


def _one(args: tuple[str, str, int, float, str]) -> RunResult:
    trace, policy, seed, ratio, nodes = args
    pods, node_rows = _load(trace, Path(nodes))
    return replay(pods, node_rows, policy, seed, trace=trace_label(trace), ratio=ratio)


def run_many(
    trace: str, policy: str, seeds: Sequence[int], ratio: float, nodes: Path, jobs: int
) -> list[RunResult]:
    _load(trace, nodes)  # fail fast, and report bad rows once
    work = [(trace, policy, s, ratio, str(nodes)) for s in seeds]
    if jobs <= 1:
        return [_one(w) for w in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_one, work))


def summary(results: Sequence[RunResult]) -> dict[str, object]:
    def mean(values: list[float]) -> float | None:
        return round(float(np.mean(values)), 2) if values else None

    timings = [t for r in results for t in r.decision_s]
    total = sum(timings)
    cpu = sum(r.decision_cpu_s for r in results)
    return {
        "policy": results[0].policy,
        "trace": results[0].trace,
        "seeds": [r.seed for r in results],
        "alloc_pct": {str(p): mean([r.alloc_pct[p] for r in results if p in r.alloc_pct]) for p in POINTS},
        "frag_ratio_pct": {"90": mean([r.frag_ratio_pct[90] for r in results if 90 in r.frag_ratio_pct])},
        "failed_pods": round(float(np.mean([r.failed for r in results])), 1),
        "decisions_per_s": round(len(timings) / total, 1) if total else None,
        "p99_decision_ms": round(float(np.percentile(timings, 99) * 1000), 3) if timings else None,
        "warm_s": round(float(np.mean([r.warm_s for r in results])), 3),
        "decisions_per_cpu_s": round(len(timings) / cpu, 1) if cpu else None,
    }


def _fmt(x: object) -> str:
    return "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))


def cmd_replay(ns: argparse.Namespace) -> int:
    results = run_many(ns.trace, ns.policy, ns.seeds, ns.ratio, ns.nodes, ns.jobs)
    s = summary(results)
    if ns.json:
        print(json.dumps(s))
        return 0
    print(f"trace {s['trace']}  policy {ns.policy}  seeds {ns.seeds[0]}..{ns.seeds[-1]}  ratio {ns.ratio}")
    print(
        f"{'seed':>6} {'alloc@100':>10} {'alloc@130':>10} {'frag@90':>8} "
        f"{'failed':>7} {'dec/s':>8} {'p99 ms':>7}"
    )
    for r in results:
        print(
            f"{r.seed:>6} {_fmt(r.alloc_pct.get(100)):>10} {_fmt(r.alloc_pct.get(130)):>10} "
            f"{_fmt(r.frag_ratio_pct.get(90)):>8} {r.failed:>7} "
            f"{r.decisions_per_s:>8.0f} {r.p99_decision_ms:>7.2f}"
        )
    a = s["alloc_pct"]
    print(
        f"{'mean':>6} {_fmt(a['100']):>10} {_fmt(a['130']):>10} {_fmt(s['frag_ratio_pct']['90']):>8} "
        f"{s['failed_pods']:>7} {s['decisions_per_s']:>8} {s['p99_decision_ms']:>7}"
    )
    ref = published().get((s["trace"], ns.policy))
    if ref:
        print(
            f"{'paper':>6} {_fmt(mean_at(ref, 100)):>10} {_fmt(mean_at(ref, 130)):>10}"
            "   (FGD artifact, 10 seeds)"
        )
    return 0


def cmd_compare(ns: argparse.Namespace) -> int:
    policies = POLICIES if ns.policies == "all" else tuple(ns.policies.split(","))
    ref = published()
    label = trace_label(ns.trace)
    rows, curves = [], {}
    for policy in policies:
        results = run_many(ns.trace, policy, ns.seeds, ns.ratio, ns.nodes, ns.jobs)
        s = summary(results)
        paper = ref.get((label, policy))
        s["paper_alloc_pct"] = {str(p): mean_at(paper, p) if paper else None for p in POINTS}
        rows.append(s)
        points = sorted({p for r in results for p in r.alloc_pct})
        curves[policy] = (
            points,
            [np.mean([r.alloc_pct[p] for r in results if p in r.alloc_pct]) for p in points],
        )
        if ns.json:
            print(json.dumps(s), flush=True)
    table = markdown_table(rows, label, ns.seeds)
    table += (
        f"\n\nDecision speed here is per pod inside the replays, {ns.jobs} replay(s) at a time on this machine"
        f" (load average {os.getloadavg()[0]:.1f} at the end); bench/sched_speed.py measures it alone."
    )
    if not ns.json:
        print(table)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"sched_compare_{label}"
    command = " ".join(["python -m scheduler.sim", *sys.argv[1:]])
    (out / f"{stem}.md").write_text(f"# Trace replay: {label}\n\nCommand: `{command}`\n\n{table}\n")
    (out / f"{stem}.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    plot(curves, ref, label, out / f"{stem}.png")
    print(f"wrote {out / (stem + '.md')}, {stem}.json and {stem}.png", file=sys.stderr)
    return 0


def markdown_table(rows: list[dict], label: str, seeds: Sequence[int]) -> str:
    lines = [
        f"Trace `{label}`, seeds {seeds[0]}-{seeds[-1]} (mean): allocation % of GPU capacity "
        "when the arrived demand is 100% / 130% of capacity.",
        "",
        "| policy | alloc @100% | alloc @130% | paper @100% | paper @130% "
        "| frag ratio @90% | decisions/s | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in rows:
        a, p = s["alloc_pct"], s["paper_alloc_pct"]
        lines.append(
            f"| {s['policy']} | {_fmt(a['100'])} | {_fmt(a['130'])} | {_fmt(p['100'])} | {_fmt(p['130'])} "
            f"| {_fmt(s['frag_ratio_pct']['90'])} | {_fmt(s['decisions_per_s'])} "
            f"| {_fmt(s['p99_decision_ms'])} |"
        )
    return "\n".join(lines)


def plot(curves: dict, ref: dict, label: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, (x, y) in curves.items():
        ax.plot(x, y, label=policy, linewidth=1.6)
    for name in ("fgd", "best-fit"):
        paper = ref.get((label, name))
        if paper:
            xs = list(range(0, 131))
            ys = [mean_at(paper, p) for p in xs]
            ax.plot(
                xs, ys, linestyle=":", color="black" if name == "fgd" else "grey", label=f"{name} (paper)"
            )
    ax.plot([0, 100, 130], [0, 100, 100], color="lightgrey", linewidth=0.8)
    ax.set_xlabel("arrived GPU demand (% of capacity)")
    ax.set_ylabel("GPU allocation (%)")
    ax.set_title(f"Allocation vs arrival, trace {label}")
    ax.set_xlim(60, 131)
    ax.set_ylim(55, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler.sim", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("replay", "compare"):
        p = sub.add_parser(name)
        p.add_argument("--trace", default="default", help="a shipped trace name or a pod CSV path")
        p.add_argument("--nodes", type=Path, default=DEFAULT_NODES, help="node list CSV")
        p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
        p.add_argument("--ratio", type=float, default=1.3, help="arrived demand to stop at, x capacity")
        p.add_argument("--jobs", type=int, default=1, help="replays run in parallel processes")
        p.add_argument("--json", action="store_true", help="one JSON object per policy")
        if name == "replay":
            p.add_argument("--policy", default="tessera", choices=POLICIES)
        else:
            p.add_argument("--policies", default="all", help="comma-separated, or all")
            p.add_argument("--out", default="bench/results/scheduler", help="folder for the .md/.json/.png")
    ns = parser.parse_args(argv)
    if not 0 < ns.ratio <= 5:
        parser.error("--ratio must be in (0, 5]")
    if ns.jobs < 1:
        parser.error("--jobs must be >= 1")
    try:
        return cmd_replay(ns) if ns.cmd == "replay" else cmd_compare(ns)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
