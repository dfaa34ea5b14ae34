"""Tessera's default policy: FGD's fragmentation gradient plus CPU stranding, best-fit GPU on ties.

FGD (Weng et al., ATC'23) checks each typical pod against a node alone, so a node whose CPU can
still host *one* more typical pod counts all its idle GPUs as usable, even when its CPU can feed
only a fraction of them. On the Alibaba trace the 8-GPU nodes have ~12 cores per GPU while the
workload asks ~11 per GPU on average and some shapes far more (0.47 GPU with 12 cores), so GPUs
end up idle behind exhausted CPUs. Tessera adds the growth of that stranded compute,

    stranded = max(0, free GPU milli - free CPU milli / r),   r = workload CPU per GPU milli,

to FGD's fragmentation growth (weight STRANDING_WEIGHT, GPU pods only) before FGD's integer
sigmoid score, keeps FGD's node-order tie-break (it consolidates pods onto the same nodes, which
matters more than any finer score: without ties FGD drops to ~91%), and among equal scores prefers
the fullest GPU that fits. Results against FGD per trace: bench/results/scheduler/.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .fragmentation import FgdScorer, TypicalPod, sigmoid_score
from .model import MILLI, Request
from .scorers import pod_cpu
from .state import UNTRACKED, ClusterState

STRANDING_WEIGHT = 1.0
# Below one score point, so it only orders placements FGD's integer score calls equal.
BEST_FIT_WEIGHT = 0.2


class TesseraScorer(FgdScorer):
    name = "tessera"

    def __init__(self, state: ClusterState, typical: Sequence[TypicalPod]) -> None:
        super().__init__(state, typical)
        gpu_pods = [t for t in typical if t.count > 0 and t.milli > 0]
        milli = sum(t.freq * t.milli * t.count for t in gpu_pods)
        self.cpu_per_milli = sum(t.freq * t.cpu_milli for t in gpu_pods) / milli if milli else 0.0

    def stranding_growth(self, req: Request, nodes: np.ndarray) -> np.ndarray:
        """Growth of the GPU compute that the node's CPU could not feed, per node."""
        if self.cpu_per_milli <= 0:
            return np.zeros(len(nodes))
        st = self.state
        free = st.free[nodes].sum(axis=1).astype(np.float64)
        cpu = st.cpu_free[nodes].astype(np.float64)
        cpu = np.where(st.cpu_free[nodes] == UNTRACKED, np.inf, cpu)
        before = np.maximum(0.0, free - cpu / self.cpu_per_milli)
        after = np.maximum(0.0, free - req.total_milli - (cpu - pod_cpu(req)) / self.cpu_per_milli)
        return after - before

    def node_values(self, req: Request, nodes: np.ndarray) -> np.ndarray:
        one_gpu = req.gpu_count == 1 and not req.whole
        if req.gpu_count == 0:
            # CPU-only pods keep FGD's rule: charging them for stranding pushed them onto the
            # CPU-rich nodes that GPU pods also need, and lost on the CPU-heavy traces.
            return sigmoid_score(self.deltas(req, nodes))
        growth = STRANDING_WEIGHT * self.stranding_growth(req, nodes)
        delta = self.deltas(req, nodes) - (growth[:, None] if one_gpu else growth)
        score = sigmoid_score(delta)
        if one_gpu:
            left = (self.state.free[nodes] - req.milli) / MILLI
            score = score + BEST_FIT_WEIGHT * (1.0 - left)
        return score
