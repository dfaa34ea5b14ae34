"""Trace replay, as the FGD paper's experiment (Weng et al., ATC'23, Sec. 6 / the artifact's simulator).

Per seed: the trace's pods in a shuffled order, then pods drawn with replacement until the GPU
demand that arrived would pass `ratio` x cluster capacity (or random pods dropped until it is
under, for traces that ask for more). Pods never leave; a pod that fits nowhere fails and the run
goes on. Ties between nodes go to a fixed random node order per seed (the reference prefixes node
names randomly once per run and takes the alphabetically first). Each placement runs through the
same `scheduler.core.choose` as the live cycle.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.engine import choose, make_scorer
from scheduler.core.fragmentation import Fragmentation, TypicalPod, typical_pods
from scheduler.core.model import MILLI, Request
from scheduler.core.state import ClusterState

from .trace import TraceNode, TracePod

# GPU memory per trace model (MiB); pods in the trace ask for none, so this only fills the snapshot.
MODEL_MEMORY_MIB = {"V100M16": 16384, "V100M32": 32768, "T4": 15360, "P100": 16384, "A10": 24576}


def to_request(pod: TracePod, uid: str) -> Request:
    gpu = pod.num_gpu > 0
    return Request(
        id=uid,
        gpu_request=pod.gpu_milli / MILLI if gpu else 1.0,
        gpu_count=pod.num_gpu,
        gpu_model=pod.gpu_spec or None,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
    )


def build_cluster(nodes: Sequence[TraceNode], rng: np.random.Generator) -> ClusterState:
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    return ClusterState(
        node_names=[n.name for n in gpu_nodes],
        gpu_models=[[n.model] * n.gpus for n in gpu_nodes],
        gpu_memory_mib=[[MODEL_MEMORY_MIB.get(n.model, 32768)] * n.gpus for n in gpu_nodes],
        cpu_milli_free=[n.cpu_milli for n in gpu_nodes],
        memory_mib_free=[n.memory_mib for n in gpu_nodes],
        tie_rank=rng.permutation(len(gpu_nodes)),
    )


def arrival_order(
    pods: Sequence[TracePod], capacity_milli: int, ratio: float, rng: np.random.Generator
) -> list[int]:
    """Indexes into `pods`: shuffled, then topped up (or thinned) to `ratio` of capacity."""
    order = [int(i) for i in rng.permutation(len(pods))]
    demand = sum(pods[i].num_gpu * pods[i].gpu_milli for i in order)
    target = ratio * capacity_milli
    while demand > target and order:
        drop = int(rng.integers(len(order)))
        demand -= pods[order[drop]].num_gpu * pods[order[drop]].gpu_milli
        order.pop(drop)
    while True:
        i = int(rng.integers(len(pods)))
        # The reference's stop test adds the next pod's per-GPU milli, not its total.
        if demand + pods[i].gpu_milli > target:
            break
        demand += pods[i].num_gpu * pods[i].gpu_milli
        order.append(i)
    return order


@dataclass
class RunResult:
    policy: str
    trace: str
    seed: int
    alloc_pct: dict[int, float]  # arrived % (rounded) -> mean allocation % over pods in that bucket
    frag_ratio_pct: dict[int, float]
    pods: int
    failed: int
    decision_s: list[float] = field(repr=False, default_factory=list)
    warm_s: float = 0.0  # building the typical shapes' score tables, before the first pod
    decision_cpu_s: float = 0.0  # CPU time of all decisions (thread time)

    @property
    def decisions_per_s(self) -> float:
        total = sum(self.decision_s)
        return len(self.decision_s) / total if total > 0 else 0.0

    @property
    def p99_decision_ms(self) -> float:
        return float(np.percentile(self.decision_s, 99) * 1000) if self.decision_s else 0.0


def replay(
    pods: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    policy: str,
    seed: int,
    *,
    trace: str = "",
    ratio: float = 1.3,
    typical: Sequence[TypicalPod] | None = None,
) -> RunResult:
    rng = np.random.default_rng(seed)
    state = build_cluster(nodes, rng)
    capacity = int(state.valid.sum()) * MILLI
    requests = [to_request(p, f"{p.name}") for p in pods]
    if typical is None:
        typical = typical_pods(requests)
    order = arrival_order(pods, capacity, ratio, rng)
    scorer = make_scorer(policy, state, typical, seed=seed)
    started = time.perf_counter()
    if hasattr(scorer, "warm"):  # FGD-style score tables for the typical shapes, built before pod 1
        scorer.warm(typical)
    warm_s = time.perf_counter() - started
    meter = Fragmentation(state, typical)
    alloc: dict[int, list[float]] = defaultdict(list)
    frag: dict[int, list[float]] = defaultdict(list)
    arrived = used = failed = 0
    timings: list[float] = []
    cpu_used = 0.0  # CPU time of the decisions: what they cost when other work shares the cores
    clock, cpu_clock = time.perf_counter, time.thread_time
    for k, i in enumerate(order):
        base = requests[i]
        req = Request(
            id=f"{k}",
            gpu_request=base.gpu_request,
            gpu_count=base.gpu_count,
            gpu_model=base.gpu_model,
            cpu_milli=base.cpu_milli,
            memory_mib=base.memory_mib,
        )
        t0, c0 = clock(), cpu_clock()
        choice = choose(state, req, scorer)
        if choice is not None:
            state.reserve(req, choice.node, choice.slots)
        timings.append(clock() - t0)
        cpu_used += cpu_clock() - c0
        arrived += req.total_milli
        if choice is None:
            failed += 1
        else:
            used += req.total_milli
        bucket = round(arrived / capacity * 100)
        alloc[bucket].append(used / capacity * 100)
        if bucket % 10 == 0:  # the fragmentation measure is costlier; sample the reported points
            idle = capacity - used
            frag[bucket].append(meter.cluster_frag() / idle * 100 if idle else 0.0)
    return RunResult(
        policy=policy,
        trace=trace,
        seed=seed,
        alloc_pct=_discrete(alloc, int(ratio * 100)),
        frag_ratio_pct=_discrete(frag, int(ratio * 100)),
        pods=len(order),
        failed=failed,
        decision_s=timings,
        warm_s=warm_s,
        decision_cpu_s=cpu_used,
    )


def _discrete(records: dict[int, list[float]], last: int) -> dict[int, float]:
    """Mean per rounded arrived %; a point with no record takes the records within +-1, as the reference."""
    out: dict[int, float] = {}
    for point in range(0, last + 1):
        values = records.get(point) or [v for p in (point - 1, point + 1) for v in records.get(p, [])]
        if values:
            out[point] = round(float(np.mean(values)), 2)
    return out
