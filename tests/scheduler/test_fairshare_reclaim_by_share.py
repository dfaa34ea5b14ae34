"""Reclaim by fair share: a team below its deserved share takes back borrowed capacity from the
team furthest above its share, after that team's grace, and never so far that the two would
swap GPUs back and forth."""

from __future__ import annotations

from scheduler.core import Preemption, Reclaim, Unit, Unschedulable
from tests.scheduler.test_fairshare import decisions, node, q, req, share, tree


def two_teams(grace: float = 0.0, c_quota: float | None = None):
    """4 A100s; a and b each a quota of 1 with unlimited borrowing (c: a third team, no quota)."""
    units = [Unit("a", quotas={"A100": q(1, 0)}, reclaim_grace_s=grace),
             Unit("b", quotas={"A100": q(1, 0)}, reclaim_grace_s=grace)]
    if c_quota is not None:
        units.append(Unit("c", quotas={"A100": q(c_quota, 0)}, reclaim_grace_s=grace))
    return tree(*units)


def mine(rid, team, gpu_request=1.0, **kw):
    return share(rid, team, gpu_request, memory_gib=0, **kw)


def asks(rid, team, gpu_request=1.0, **kw):
    return req(rid, team, gpu_request, memory_gib=0, **kw)


def test_a_team_below_its_share_takes_back_from_the_team_above_it_up_to_its_share():
    # a holds 3 (1 within quota, 2 borrowed), b 1 and waits for 2 more: each deserves 2.
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", since=1)],
               2: [mine("a3", "a", admission="borrowed", since=2)], 3: [mine("b1", "b")]}
    ds = decisions([node("n1", "A100", 4, running)], two_teams(),
                   [asks("b2", "b", priority=1, created=1), asks("b3", "b", priority=1, created=2)])
    taken = [d for d in ds if isinstance(d, Preemption)]
    assert [(d.request_id, d.victims, d.placement.admission) for d in taken] == [("b2", ("a3",), "borrowed")]
    assert isinstance(next(d for d in ds if getattr(d, "request_id", None) == "b3"), Unschedulable)


def test_two_teams_near_their_shares_do_not_swap_gpus():
    # a holds 2.25 of its 2, b 1.75 of its 2: one more GPU would put b further above its share
    # than it is below, and a below its own; b waits.
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", since=1)],
               2: [mine("a3", "a", 0.25, admission="borrowed", since=2),
                   mine("b2", "b", 0.75, admission="borrowed", since=3)], 3: [mine("b1", "b")]}
    (d,) = decisions([node("n1", "A100", 4, running)], two_teams(), [asks("b3", "b", priority=5)])
    assert isinstance(d, Unschedulable)


def test_the_victim_team_is_never_pushed_below_its_share():
    # b asks for 2 GPUs at once: a would drop from 3 to 1 of its 2; b waits.
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", since=1)],
               2: [mine("a3", "a", admission="borrowed", since=2)], 3: [mine("b1", "b")]}
    (d,) = decisions([node("n1", "A100", 4, running)], two_teams(), [asks("b2", "b", count=2, priority=5)])
    assert isinstance(d, Unschedulable)


def test_the_victim_team_keeps_its_grace():
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", since=1)],
               2: [mine("a3", "a", admission="borrowed", since=2)], 3: [mine("b1", "b")]}
    (d,) = decisions([node("n1", "A100", 4, running)], two_teams(grace=300), [asks("b2", "b")], now=1000)
    assert isinstance(d, Reclaim) and d.victims == ("a3",) and d.due == {"a3": 1300}
    # Warned and due: the next cycle preempts it and places b's request as borrowed.
    running[2] = [mine("a3", "a", admission="borrowed", since=2, reclaim_at=1300)]
    (d,) = decisions([node("n1", "A100", 4, running)], two_teams(grace=300), [asks("b2", "b")], now=1300)
    assert isinstance(d, Preemption) and d.victims == ("a3",) and d.placement.admission == "borrowed"


def test_within_the_victim_team_the_lowest_priority_goes_first_then_the_newest():
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", priority=1, since=1)],
               2: [mine("a3", "a", admission="borrowed", priority=5, since=2)], 3: [mine("b1", "b")]}
    (d,) = decisions([node("n1", "A100", 4, running)], two_teams(), [asks("b2", "b")])
    assert isinstance(d, Preemption) and d.victims == ("a2",)


def test_the_team_furthest_above_its_share_gives_back_first():
    # 6 A100s; a holds 2 of its 2, c (no quota) 3 borrowed of its 1.5; b 1 of its 2.5.
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", since=9)],
               2: [mine("c1", "c", admission="borrowed", since=1)],
               3: [mine("c2", "c", admission="borrowed", since=2)],
               4: [mine("c3", "c", admission="borrowed", since=3)], 5: [mine("b1", "b")]}
    pending = [asks("b2", "b", created=1), asks("b3", "b", created=2), asks("c4", "c", created=3)]
    ds = decisions([node("n1", "A100", 6, running)], two_teams(c_quota=0), pending)
    taken = [(d.request_id, d.victims) for d in ds if isinstance(d, Preemption)]
    assert taken and taken[0] == ("b2", ("c3",))
    assert all("a" not in v[0] for _, v in taken)
