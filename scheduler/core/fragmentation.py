"""GPU fragmentation against a typical workload, and the FGD scorer (Weng et al., USENIX ATC'23).

A node's fragmentation is the expected GPU compute (milli) that a random pod of the typical
workload could not use there: for each typical pod that fits the node (model, CPU, enough GPUs
with room) the GPUs too small for it count; for one that does not fit, all free compute counts.

Computed here in closed form per group of typical pods with the same (milli, count):
    frag = free_total * sum(freq) - sum_k W_k(model, cpu_left) * U_k
where U_k = [GPUs with >= milli_k free >= count_k] * (their free compute), and W_k is the summed
frequency of the group's pods that may use the node's model and fit its CPU. cnt_k and U_k are
kept per node and updated only for nodes whose version changed; the FGD score of a placement
needs just the slot's value before and after, so a decision costs O(changed nodes x slots x groups).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .filters import only_compute_per_gpu
from .model import MILLI, Request
from .scorers import pick_slot, pod_cpu
from .state import UNTRACKED, ClusterState


@dataclass(frozen=True)
class TypicalPod:
    cpu_milli: int
    milli: int  # per GPU; 0 for CPU-only pods
    count: int
    models: frozenset[str] | None
    freq: float


def typical_pods(requests: Iterable[Request], coverage: float = 0.95) -> list[TypicalPod]:
    """The most frequent request shapes that together cover `coverage` of the requests.

    Shapes are (CPU with 0 counted as 100m, milli per GPU, GPU count, model set), most frequent
    first; frequencies are renormalised over the kept shapes.
    """
    counts: Counter[tuple[int, int, int, str]] = Counter()
    for r in requests:
        models = "|".join(sorted(r.gpu_model)) if r.gpu_model else ""
        milli = r.milli if r.gpu_count > 0 else 0
        counts[(pod_cpu(r), milli, r.gpu_count, models)] += 1
    total = sum(counts.values())
    if total == 0:
        return []
    # Most frequent first; equal counts in descending (cpu, milli, count, model) order, as the reference.
    ordered = sorted(
        counts.items(), key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], kv[0][3]), reverse=True
    )
    kept, cum = [], 0
    for shape, n in ordered:
        if cum >= coverage * total:
            break
        kept.append((shape, n))
        cum += n
    return [
        TypicalPod(cpu, milli, count, frozenset(models.split("|")) if models else None, n / cum)
        for (cpu, milli, count, models), n in kept
    ]


_PLENTY = np.int64(1 << 50)


def sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """The reference's int64(sigmoid(delta / 1000) * 100): integers 0..100, ties are common."""
    return np.floor(100.0 / (1.0 + np.exp(-delta / 1000.0)))


class Fragmentation:
    """Per-node fragmentation of a ClusterState, kept up to date lazily by node version."""

    def __init__(self, state: ClusterState, typical: Sequence[TypicalPod]) -> None:
        self.state = state
        gpu_pods = [t for t in typical if t.milli > 0 and t.count > 0]
        keys = sorted({(t.milli, t.count) for t in gpu_pods})
        self.group_milli = np.array([k[0] for k in keys], dtype=np.int64)
        self.group_count = np.array([k[1] for k in keys], dtype=np.int64)
        group_of = {k: i for i, k in enumerate(keys)}
        self.total_freq = float(sum(t.freq for t in typical))
        self.t_cpu = np.array([t.cpu_milli for t in gpu_pods], dtype=np.int64)
        self.t_freq = np.array([t.freq for t in gpu_pods], dtype=np.float64)
        n_models = len(state.models)
        # acc[t, model]: the typical pod may use that model; the last column is "node without GPUs".
        self.acc = np.zeros((len(gpu_pods), n_models + 1), dtype=bool)
        for i, t in enumerate(gpu_pods):
            for m, name in enumerate(state.models):
                self.acc[i, m] = t.models is None or name in t.models
        self.onehot = np.zeros((len(gpu_pods), len(keys)), dtype=np.float64)
        for i, t in enumerate(gpu_pods):
            self.onehot[i, group_of[(t.milli, t.count)]] = 1.0
        # W is a step function of the node's free CPU: tabulate it per model at every CPU threshold.
        self.cpu_steps = np.unique(self.t_cpu)
        fits_at = self.t_cpu[:, None] <= self.cpu_steps[None, :]  # (T, steps)
        table = np.zeros((self.acc.shape[1], len(self.cpu_steps) + 1, len(keys)))
        for m in range(self.acc.shape[1]):
            w = (fits_at & self.acc[:, m, None]) * self.t_freq[:, None]  # (T, steps)
            table[m, 1:] = w.T @ self.onehot
        self.w_table = table
        n = len(state.node_names)
        self.cnt = np.zeros((n, len(keys)), dtype=np.int64)
        self.usable = np.zeros((n, len(keys)), dtype=np.float64)
        self.sums = np.zeros((n, len(keys)), dtype=np.float64)
        self.frag = np.zeros(n, dtype=np.float64)
        self.seen = np.full(n, -1, dtype=np.int64)
        # Nodes in the same state (GPU free row, CPU, model) share a class id: scorers compute once per class.
        self.node_class = np.zeros(n, dtype=np.int64)
        self._classes: dict[bytes, int] = {}

    # ---- per node -----------------------------------------------------------------------------
    def weights(self, nodes: np.ndarray, cpu_left: np.ndarray) -> np.ndarray:
        """W[node, group]: frequency of the group's typical pods that may run on the node's CPU/model."""
        model = self.state.node_model[nodes]
        model = np.where(model < 0, self.acc.shape[1] - 1, model)
        step = np.searchsorted(self.cpu_steps, cpu_left, side="right")
        return self.w_table[model, step]

    def refresh(self) -> np.ndarray:
        """Bring node summaries up to date; returns the nodes that changed."""
        stale = np.flatnonzero(self.seen != self.state.version)
        if stale.size:
            free = self.state.free[stale]
            inside = free[:, :, None] >= self.group_milli[None, None, :]
            self.cnt[stale] = inside.sum(axis=1)
            self.sums[stale] = (free[:, :, None] * inside).sum(axis=1)
            self.usable[stale] = np.where(self.cnt[stale] >= self.group_count, self.sums[stale], 0.0)
            w = self.weights(stale, self.cpu_left(stale))
            total = free.sum(axis=1)
            self.frag[stale] = total * self.total_freq - (w * self.usable[stale]).sum(axis=1)
            self.seen[stale] = self.state.version[stale]
            keys = np.concatenate(
                [
                    free,
                    self.state.cpu_free[stale, None],
                    self.state.node_model[stale, None],
                    self.state.gpu_count[stale, None],
                ],
                axis=1,
            )
            classes = self._classes
            for i, row in zip(stale.tolist(), keys, strict=True):
                self.node_class[i] = classes.setdefault(row.tobytes(), len(classes))
        return stale

    def cpu_left(self, nodes: np.ndarray) -> np.ndarray:
        cpu = self.state.cpu_free[nodes]
        return np.where(cpu == UNTRACKED, _PLENTY, cpu)

    def cluster_frag(self) -> float:
        self.refresh()
        return float(self.frag.sum())

    # ---- what a placement would do ------------------------------------------------------------
    def after_one_gpu(self, nodes: np.ndarray, milli: int, cpu: int) -> np.ndarray:
        """Fragmentation of each node after taking `milli` on each of its slots (nodes x slots)."""
        v = self.state.free[nodes].astype(np.float64)  # (d, G)
        after = v - milli
        m_k = self.group_milli[None, None, :]
        was_in = v[:, :, None] >= m_k
        stays_in = after[:, :, None] >= m_k
        cnt = self.cnt[nodes][:, None, :] - (was_in & ~stays_in)
        sums = self.sums[nodes][:, None, :] - np.where(
            stays_in, float(milli), np.where(was_in, v[:, :, None], 0.0)
        )
        usable = np.where(cnt >= self.group_count, sums, 0.0)
        w = self.weights(nodes, self.cpu_left(nodes) - cpu)  # (d, K)
        total = self.state.free[nodes].sum(axis=1) - milli
        return total[:, None] * self.total_freq - (w[:, None, :] * usable).sum(axis=2)

    def after_whole(self, nodes: np.ndarray, count: int, cpu: int) -> np.ndarray:
        """Fragmentation of each node after taking `count` fully free GPUs (and the CPU)."""
        cnt = self.cnt[nodes] - count
        sums = self.sums[nodes] - float(count * MILLI)
        usable = np.where(cnt >= self.group_count, sums, 0.0)
        w = self.weights(nodes, self.cpu_left(nodes) - cpu)
        total = self.state.free[nodes].sum(axis=1) - count * MILLI
        return total * self.total_freq - (w * usable).sum(axis=1)


class FgdScorer:
    """FGD: the placement that grows the node's fragmentation least, as integer scores 0..100.

    Scores per request shape are cached per node and recomputed only for nodes changed since that
    shape was last scored, so each decision still considers every node.
    """

    name = "fgd"

    def __init__(self, state: ClusterState, typical: Sequence[TypicalPod]) -> None:
        self.state = state
        self.frag = Fragmentation(state, typical)
        self.cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    def deltas(self, req: Request, nodes: np.ndarray) -> np.ndarray:
        """Fragmentation growth of placing `req` on `nodes` (per slot for one-GPU requests)."""
        before = self.frag.frag[nodes]
        cpu = pod_cpu(req)
        if req.gpu_count == 1 and not req.whole:
            return before[:, None] - self.frag.after_one_gpu(nodes, req.milli, cpu)
        return before - self.frag.after_whole(nodes, req.gpu_count, cpu)

    def node_values(self, req: Request, nodes: np.ndarray) -> np.ndarray:
        return sigmoid_score(self.deltas(req, nodes))

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        entry = self._scores(req)
        one_gpu = req.gpu_count == 1 and not req.whole
        if not one_gpu:
            return entry.best.copy(), entry.slot
        if only_compute_per_gpu(state, req):
            return entry.best.copy(), entry.slot
        # Only nodes with room are ever chosen: pick slots there (elsewhere -inf, no slot).
        rows = np.flatnonzero(room)
        best, slot = np.full(len(room), -np.inf), np.full(len(room), -1, dtype=np.int64)
        best[rows], slot[rows] = pick_slot(entry.values[rows], ok[rows])
        return best, slot

    def warm(self, typical: Sequence[TypicalPod]) -> None:
        """Fill the score tables of the typical shapes now, so that their first decisions are not slow."""
        for t in typical:
            if t.count > 0:
                self._scores(Request("warm", gpu_request=t.milli / MILLI, gpu_count=t.count, cpu_milli=t.cpu_milli))
            else:
                self._scores(Request("warm", gpu_count=0, cpu_milli=t.cpu_milli))

    def _scores(self, req: Request) -> _ShapeScores:
        """This request shape's scores for every node, recomputed where a node changed since."""
        state = self.state
        self.frag.refresh()
        key = (req.milli if req.gpu_count else 0, req.gpu_count, pod_cpu(req))
        one_gpu = req.gpu_count == 1 and not req.whole
        n, width = state.free.shape
        entry = self.cache.get(key)
        if entry is None:
            entry = _ShapeScores(n, width if one_gpu else 0)
            self.cache[key] = entry
        stale = np.flatnonzero(entry.seen != state.version)
        if stale.size:
            values = self._values_deduplicated(req, stale, entry.by_class)
            if one_gpu:
                values = np.where(state.free[stale] >= req.milli, values, -np.inf)
                entry.values[stale] = values
                best, slot = pick_slot(values, np.isfinite(values))
                entry.best[stale] = best
                entry.slot[stale] = slot
            else:
                entry.best[stale] = values
            entry.seen[stale] = state.version[stale]
        return entry

    def _values_deduplicated(self, req: Request, nodes: np.ndarray, known: dict[int, np.ndarray]) -> np.ndarray:
        """node_values, computed once per distinct node state (many nodes look alike, e.g. empty).
        A node's values for a request shape depend only on its state class, so they are kept in
        `known` (class → values, the shape's) for the whole cycle: in a burst, nodes fill through
        the same states again and again, and a decision usually rescores one node whose new state
        some other node had before."""
        classes = self.frag.node_class[nodes]
        if nodes.size == 1:
            c = int(classes[0])
            row = known.get(c)
            if row is None:
                row = known[c] = self.node_values(req, nodes)[0]
            return row[None]
        if nodes.size < DEDUP_ABOVE:
            computed, values, spread = classes, self.node_values(req, nodes), None
        else:
            _, first, spread = np.unique(classes, return_index=True, return_inverse=True)
            computed, values = classes[first], self.node_values(req, nodes[first])
        for c, row in zip(computed.tolist(), values, strict=True):
            known.setdefault(c, row)
        return values if spread is None else values[spread.reshape(-1)]


# Below this many nodes to rescore, finding the distinct ones costs more than it saves.
DEDUP_ABOVE = 48


class _ShapeScores:
    """One request shape's scores per node (and per slot), with the node versions they are for."""

    def __init__(self, n: int, width: int) -> None:
        self.seen = np.full(n, -1, dtype=np.int64)
        self.values = np.full((n, width), -np.inf)
        self.best = np.full(n, -np.inf)
        self.slot = np.full(n, -1, dtype=np.int64)
        self.by_class: dict[int, np.ndarray] = {}  # node state class → values (see _values_deduplicated)
