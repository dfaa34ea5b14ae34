"""Tessera vs FGD (ours, and the paper's published means) on every shipped openb trace.

    nice -n 10 .venv/bin/python bench/sched_all_traces.py --seeds 42-51 --jobs 2

Writes bench/results/scheduler/sched_all_traces.{md,json}: allocation % at 100% / 130% arrived
per trace, the difference Tessera - FGD measured in the same run, and whether Tessera >= FGD.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.sim.cli import DEFAULT_NODES, parse_seeds, run_many, summary
from scheduler.sim.reference import mean_at, published
from scheduler.sim.trace import shipped_traces

OUT = Path(__file__).resolve().parent / "results" / "scheduler"


def write(rows: list[dict], policies: list[str], ns: argparse.Namespace, started: float) -> None:
    command = "; ".join([*ns.earlier_commands, "python bench/sched_all_traces.py " + " ".join(sys.argv[1:])])
    base, ours = policies[0], policies[-1]
    lines = [
        f"# {ours} vs {base} on every shipped trace",
        "",
        f"Command: `{command}` (under `nice -n 10`), seeds {ns.seeds[0]}-{ns.seeds[-1]}, "
        f"{time.time() - started:.0f} s. Allocation % of GPU capacity at 100% / 130% arrived "
        "(mean over seeds).",
        "",
        f"| trace | paper FGD @100 | paper FGD @130 | {base} @100 | {base} @130 | {ours} @100 | {ours} @130 "
        f"| {ours} - {base} @130 | {ours} >= {base} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    wins = 0
    for row in rows:
        b, o, p = row[base]["alloc_pct"], row[ours]["alloc_pct"], row["paper_fgd"]
        diff = (o["130"] or 0) - (b["130"] or 0)
        ok = diff >= 0 and (o["100"] or 0) >= (b["100"] or 0) - 0.005
        wins += ok
        lines.append(
            f"| {row['trace']} | {p['100'] or '-'} | {p['130'] or '-'} | {b['100']} | {b['130']} "
            f"| {o['100']} | {o['130']} | {diff:+.2f} | {'yes' if ok else 'NO'} |"
        )
    lines += ["", f"{ours} >= {base} at both points on {wins} of {len(rows)} traces."]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sched_all_traces.md").write_text("\n".join(lines) + "\n")
    (OUT / "sched_all_traces.json").write_text(
        json.dumps({"command": command, "rows": rows}, indent=1) + "\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    parser.add_argument("--traces", default="all")
    parser.add_argument("--policies", default="fgd,tessera")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--merge", action="store_true", help="keep earlier rows of traces not rerun")
    ns = parser.parse_args()
    traces = shipped_traces() if ns.traces == "all" else ns.traces.split(",")
    policies = ns.policies.split(",")
    ref = published()
    rows = []
    ns.earlier_commands = []
    if ns.merge and (OUT / "sched_all_traces.json").is_file():
        earlier = json.loads((OUT / "sched_all_traces.json").read_text())
        rows = [r for r in earlier["rows"] if r["trace"] not in traces]
        ns.earlier_commands = [earlier["command"]]
    started = time.time()
    for trace in traces:
        row: dict[str, object] = {"trace": trace}
        for policy in policies:
            s = summary(run_many(trace, policy, ns.seeds, 1.3, DEFAULT_NODES, ns.jobs))
            row[policy] = s
        paper = ref.get((trace, "fgd"))
        row["paper_fgd"] = {str(p): mean_at(paper, p) if paper else None for p in (100, 130)}
        rows.append(row)
        rows.sort(key=lambda r: r["trace"])
        print(json.dumps(row), flush=True)
        write(rows, policies, ns, started)  # partial results survive an interrupted run
    write(rows, policies, ns, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
