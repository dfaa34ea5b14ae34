"""With `keep_apart` (off by default: in the replay it added evictions on two seeds of three),
placement keeps empty nodes whole for jobs that need a whole node, and keeps guaranteed work apart
from work that may be taken back, so that a reclaim can empty a node (scheduler/core/segregation.py)."""

from __future__ import annotations

from scheduler.core import Preemption, Snapshot, Unit, decide, judge
from tests.scheduler.test_fairshare import node, q, tree
from tests.scheduler.test_fairshare_reclaim_by_share import asks, mine


def lab():
    """a has a quota of 4 A100s, b of 8; three 4-GPU nodes: n1 holds nothing, n2 a borrowed job
    of a's, n3 a guaranteed one (node order alone would pick n1 first)."""
    quotas = tree(Unit("a", quotas={"A100": q(4, 0)}), Unit("b", quotas={"A100": q(8, 0)}))
    nodes = [node("n1", "A100", 4),
             node("n2", "A100", 4, {0: [mine("x1", "a", admission="borrowed")]}),
             node("n3", "A100", 4, {0: [mine("g1", "a")]})]
    return nodes, quotas


def decisions(nodes, quotas, pending, keep_apart=True):
    return list(decide(Snapshot(tuple(nodes), quotas=quotas, now=1000.0), pending, keep_apart=keep_apart))


def placed_on(ds, rid):
    return next(d for d in ds if not isinstance(d, Preemption) and d[0].request_id == rid)[0].node


def test_guaranteed_work_goes_beside_guaranteed_work_and_leaves_the_empty_node_whole():
    nodes, quotas = lab()
    ds = decisions(nodes, quotas, [asks("b1", "b")])
    assert placed_on(ds, "b1") == "n3"


def test_borrowed_work_goes_beside_borrowed_work_so_one_reclaim_can_empty_that_node():
    nodes, quotas = lab()
    # a2 and a3 fill a's quota of 4 (beside g1, on n3); a4, beyond it, borrows b's and fits n2 or n3.
    ds = decisions(nodes, quotas, [asks("a2", "a"), asks("a3", "a"), asks("a4", "a", count=2)])
    placed = {d[0].request_id: (d[0].node, d[0].admission) for d in ds if isinstance(d, tuple)}
    assert placed["a4"] == ("n2", "borrowed")


def test_a_job_that_needs_a_whole_node_still_finds_the_empty_one():
    nodes, quotas = lab()
    ds = decisions(nodes, quotas, [asks("b1", "b"), asks("b2", "b", count=4)])
    assert placed_on(ds, "b1") == "n3" and placed_on(ds, "b2") == "n1"


def test_the_request_preview_names_first_the_node_the_cycle_would_choose():
    nodes, quotas = lab()
    judged = judge(Snapshot(tuple(nodes), quotas=quotas, now=1000.0), asks("b1", "b"), keep_apart=True)
    assert judged.admission == "guaranteed" and judged.candidates[0].node == "n3"
    assert placed_on(decisions(nodes, quotas, [asks("b1", "b")]), "b1") == "n3"


def test_by_default_placement_does_not_look_at_what_nodes_hold():
    nodes, quotas = lab()
    assert placed_on(decisions(nodes, quotas, [asks("b1", "b")], keep_apart=False), "b1") == "n1"
