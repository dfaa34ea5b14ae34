"""With labels on shares or requests, `feasible` (node rules, model, memory and compute at once,
then the label filters) answers as the whole filter chain does."""

import numpy as np
import pytest

from scheduler import core
from scheduler.core.filters import feasible, feasible_by_filters
from scheduler.core.state import ClusterState
from tests.scheduler.test_decisions_unchanged import workload


@pytest.mark.parametrize("seed", range(3))
def test_feasible_with_labels_equals_the_filter_chain(seed):
    snapshot, pending = workload(core, seed, quotas=False)  # labels, nodes short of CPU, draining nodes
    state = ClusterState.from_snapshot(snapshot)
    assert state.has_labels
    placed = 0
    for req in pending:
        ok = feasible(state, req)
        assert np.array_equal(ok, feasible_by_filters(state, req)), req.id
        slots = np.flatnonzero(ok[ok.sum(axis=1).argmax()])[: req.gpu_count]
        if req.gpu_count and len(slots) == req.gpu_count:  # take it, so later requests see more labels
            state.reserve(req, int(ok.sum(axis=1).argmax()), tuple(int(j) for j in slots))
            placed += 1
    assert placed > 50
