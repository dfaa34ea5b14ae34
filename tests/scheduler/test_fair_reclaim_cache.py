"""What a reclaim by fair share keeps between requests within one cycle is never stale.

`Fair` keeps a failed reclaim by fair share per request shape, and the shares such a reclaim may
take per model and team with their rank, while no decision has changed what they read
(`Fair.changes`). A search that failed must run again once the state changed, and the cycle must
decide exactly as it does with nothing kept.
"""

from __future__ import annotations

from contextlib import ExitStack
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings

from scheduler.core import Gpu, Node, Snapshot
from scheduler.core.fairqueue import Fair
from scheduler.core.scorers import BestFitScorer
from scheduler.core.state import ClusterState
from tests.scheduler.test_fair_search_bounds import exact, two_cycles
from tests.scheduler.test_fairshare import GIB, node, req
from tests.scheduler.test_fairshare_properties import cases, seeded_cycle
from tests.scheduler.test_fairshare_reclaim_by_share import mine, two_teams

SLOW = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fleet_where_a_is_at_its_share() -> tuple[Fair, ClusterState]:
    """n1: 4 A100s, a holds 3 (2 borrowed) and b 1; n2: one free A100 of 10 GiB, too small for
    b's 20 GiB requests. a and b each deserve 2.5 (a wants one more, b two): taking one of a's
    borrowed GPUs would leave a below its share, so b may not reclaim it."""
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", since=1)],
               2: [mine("a3", "a", admission="borrowed", since=2)], 3: [mine("b1", "b")]}
    small = Node("n2", (Gpu("n2-0", 0, "A100", 10 * GIB),))
    snapshot = Snapshot((node("n1", "A100", 4, running), small), quotas=two_teams(), now=1000.0)
    state = ClusterState.from_snapshot(snapshot)
    pending = [req("ax", "a", memory_gib=1), req("b1-more", "b", memory_gib=20), req("b2-more", "b", memory_gib=20)]
    return Fair(state, snapshot.quotas, pending, snapshot.now), state


def test_a_failed_reclaim_is_searched_again_once_a_placement_changed_the_victim_team():
    fair, _ = fleet_where_a_is_at_its_share()
    assert fair.preempt(req("b1-more", "b", memory_gib=20)) is None  # a would drop below its share
    choice, _ = fair.try_place(req("ax", "a", memory_gib=1), BestFitScorer())  # on n2: a now holds 4
    assert choice is not None
    # The same shape again: a stays at its share without a3 (its newest borrowed), so b takes it back.
    found = fair.preempt(req("b2-more", "b", memory_gib=20))
    assert found is not None
    _, victims, admission, _ = found
    assert victims == ("a3",) and admission == "borrowed"


def test_a_failed_reclaim_is_searched_again_once_a_release_changed_the_state():
    fair, state = fleet_where_a_is_at_its_share()
    fair.try_place(req("ax", "a", memory_gib=1), BestFitScorer())
    assert fair.preempt(req("b1-more", "b", memory_gib=20)) is not None  # a3 is taken back...
    fair.release("ax")  # ...but a's pod group is rolled back: a holds 3 again
    assert "ax" not in state.placed
    assert fair.preempt(req("b2-more", "b", memory_gib=20)) is None


def test_a_failed_reclaim_is_not_searched_again_while_nothing_changed():
    fair, _ = fleet_where_a_is_at_its_share()
    searched = []
    search = Fair.search_by_share

    def counting(self, r):
        searched.append(r.id)
        return search(self, r)

    with patch.object(Fair, "search_by_share", counting):
        assert fair.preempt(req("b1-more", "b", memory_gib=20)) is None
        assert fair.preempt(req("b2-more", "b", memory_gib=20)) is None
        assert fair.preempt(req("b3-more", "b", memory_gib=21)) is None  # another shape: searched
    assert searched == ["b1-more", "b3-more"]


def nothing_kept() -> ExitStack:
    """Every reclaim by fair share searched and every candidate worked out afresh."""
    stack = ExitStack()
    stack.enter_context(patch("scheduler.core.fairqueue._reclaim_key", lambda r: object()))

    def afresh(self):
        self._candidates.clear()
        self._own.clear()

    stack.enter_context(patch.object(Fair, "_fresh_candidates", afresh))
    return stack


@SLOW
@given(case=cases())
def test_what_is_kept_never_changes_a_decision(case):
    kept = two_cycles(case)
    with nothing_kept():
        afresh = two_cycles(case)
    assert [exact(d) for d in kept] == [exact(d) for d in afresh]


def test_a_seeded_cycle_decides_the_same_with_nothing_kept():
    tree, nodes, first, second = seeded_cycle()
    case = (tree, nodes, first, second, {"n0"})
    kept = two_cycles(case)
    with nothing_kept():
        afresh = two_cycles(case)
    assert [exact(d) for d in kept] == [exact(d) for d in afresh]
