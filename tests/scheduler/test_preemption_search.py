"""The preemption search asked about a rule's possible victims only (`among`, or the state's index
for the default rule) finds what it finds when it asks the rule about every share."""

import pytest

from scheduler import core
from scheduler.core.preemption import find_preemption, may_evict
from scheduler.core.state import ClusterState
from tests.scheduler.test_decisions_unchanged import workload


def borrowed_or_own(share, req) -> bool:
    """A rule like reclaim by fair share's: the team's own lower priorities and anyone's borrowed work."""
    if share.team == req.team:
        return share.priority < req.priority
    return share.admission == "borrowed"


def answer(state: ClusterState, req, rule, **kw):
    found = find_preemption(state, req, rule, **kw)
    if found is None:
        return None
    choice, victims, released = found
    for rec in released:
        state.restore(rec)
    return choice, victims


@pytest.mark.parametrize("seed", range(3))
def test_searching_among_the_rules_candidates_finds_the_same(seed):
    snapshot, pending = workload(core, seed, quotas=False)
    state = ClusterState.from_snapshot(snapshot)
    searched = found = 0
    for req in pending:
        if req.priority == 0 or req.gpu_count == 0:
            continue
        every_share = answer(state, req, lambda s, r: may_evict(s, r))  # not the rule itself: no index
        assert answer(state, req, may_evict) == every_share
        among = state.holdings_of(teams=[req.team], admissions=["borrowed"]).values()
        assert answer(state, req, borrowed_or_own, among=among) == answer(state, req, borrowed_or_own)
        searched, found = searched + 1, found + (every_share is not None)
    assert searched > 100 and 0 < found < searched
