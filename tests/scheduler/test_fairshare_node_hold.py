"""A request for several whole GPUs on one node that fits nowhere holds a node: the one its GPUs
can be freed on at the least cost (its borrowed work reclaimed with grace), or, where none can be
freed now, the one with the fewest GPUs of work it may not take, which it waits to end. Nothing
else is placed on the held node; the hold moves or ends with the request, and guaranteed work of
another team is never evicted for it."""

from __future__ import annotations

from scheduler.core import Placement, Reclaim, Unit, decide
from scheduler.core.model import Snapshot
from tests.scheduler.test_fairshare import node, q, tree
from tests.scheduler.test_fairshare_reclaim_by_share import asks, mine


def quotas():
    """8 A100s on two nodes: a's quota 2, b's 4, c's 2 (beyond them a team borrows, with a grace)."""
    return tree(*(Unit(t, quotas={"A100": q(n, 0)}, reclaim_grace_s=300) for t, n in (("a", 2), ("b", 4), ("c", 2))))


def run(n1, n2, pending, now=1000.0, node_hold=True, **kw):
    """The cycle with node holds on (they are off by default)."""
    snap = Snapshot((node("n1", "A100", 4, n1), node("n2", "A100", 4, n2)), quotas=quotas(), now=now)
    kw["node_hold"] = node_hold
    return {d.request_id if not isinstance(d, tuple) else d[0].request_id: d for d in decide(snap, pending, **kw)}


def test_the_node_freed_at_the_least_cost_is_held_and_its_borrowed_work_reclaimed():
    # a's guaranteed job on n1, three of its borrowed jobs on n2: b's 4-GPU request takes n2.
    n1 = {0: [mine("a1", "a")]}
    n2 = {j: [mine(f"a{j + 2}", "a", admission="borrowed")] for j in range(3)}
    ds = run(n1, n2, [asks("b1", "b", count=4, created=1), asks("b2", "b", created=2)])
    held = ds["b1"]
    assert isinstance(held, Reclaim) and held.victims == ("a2", "a3", "a4")
    assert held.due == {"a2": 1300, "a3": 1300, "a4": 1300}
    assert "holding node n2 for it; 3 borrowed shares there are being reclaimed" in held.reasons[0].message
    (placed,) = ds["b2"]  # n2's free GPU is kept for b1
    assert isinstance(placed, Placement) and placed.node == "n1"


def guaranteed_on_both():
    """Guaranteed work of a (two GPUs on n1) and c (one on n2): nothing there may be evicted for b."""
    return {0: [mine("a1", "a")], 1: [mine("a2", "a")]}, {0: [mine("c1", "c")]}


def test_where_no_node_can_be_freed_the_one_nearest_to_free_is_held_and_guaranteed_work_stays():
    n1, n2 = guaranteed_on_both()
    ds = run(n1, n2, [asks("b1", "b", count=4, created=1), asks("b2", "b", count=3, created=2)])
    held = ds["b1"]
    assert isinstance(held, Reclaim) and held.victims == () and held.kind == "node_hold"
    assert held.reasons[0].message.startswith("holding node n2 for it")  # one GPU to wait for, not two
    assert not isinstance(ds["b2"], tuple)  # it would fit only on n2


def test_without_the_request_the_hold_ends():
    n1, n2 = guaranteed_on_both()
    (placed,) = run(n1, n2, [asks("b2", "b", count=3, created=2)])["b2"]
    assert placed.node == "n2"


def test_the_hold_moves_when_the_request_fits_elsewhere():
    # n1 emptied since the last cycle: the request is placed there, and n2's work is left alone.
    _, n2 = guaranteed_on_both()
    (placed,) = run({}, n2, [asks("b1", "b", count=4, created=1)])["b1"]
    assert placed.node == "n1"


def test_no_hold_when_turned_off():
    n1, n2 = guaranteed_on_both()
    ds = run(n1, n2, [asks("b1", "b", count=4, created=1), asks("b2", "b", count=3, created=2)], node_hold=False)
    assert not isinstance(ds["b1"], Reclaim)
    (placed,) = ds["b2"]
    assert placed.node == "n2"
