"""The FGD artifact's published curves (fgd_expected_results/), for side-by-side comparison."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from .trace import DEFAULT_TRACE_DIR

# The artifact's policy folder names -> ours.
POLICY_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dot-product",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "best-fit",
    "06-FGD": "fgd",
}


def published(
    metric: str = "allo", trace_dir: Path = DEFAULT_TRACE_DIR
) -> dict[tuple[str, str], dict[int, dict[int, float]]]:
    """{(trace, policy): {seed: {arrived %: value}}} from analysis_<metric>_discrete.csv."""
    path = trace_dir / "fgd_expected_results" / f"analysis_{metric}_discrete.csv"
    out: dict[tuple[str, str], dict[int, dict[int, float]]] = defaultdict(dict)
    if not path.is_file():
        return out
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            trace = row["workload"].removeprefix("openb_pod_list_")
            policy = POLICY_NAMES.get(row["sc_policy"], row["sc_policy"])
            points = {int(k): float(v) for k, v in row.items() if k.isdigit() and v not in ("", None)}
            out[(trace, policy)][int(row["seed"])] = points
    return out


def mean_at(curves: dict[int, dict[int, float]], point: int) -> float | None:
    values = [c[point] for c in curves.values() if point in c]
    return round(sum(values) / len(values), 2) if values else None
