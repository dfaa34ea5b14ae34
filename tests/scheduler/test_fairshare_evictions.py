"""Evictions are rationed (a requeued job runs again from the start): a share already warned of a
reclaim goes before anyone else is warned, work younger than the minimum run time and a job evicted
twice within four hours are left alone by takers that are not guaranteed (guaranteed ones always win),
and priority-0 work makes way for other non-guaranteed work only of a team below its fair share."""

from __future__ import annotations

from scheduler.core import Preemption, Reclaim, Unit, Unschedulable, decide
from scheduler.core.fairqueue import EVICTION_WINDOW_S, MIN_RUN_S
from scheduler.core.model import Snapshot
from tests.scheduler.test_fairshare import node, q, tree
from tests.scheduler.test_fairshare_reclaim_by_share import asks, mine, two_teams


def run(running, quotas, pending, now=1000.0, evictions=None):
    snap = Snapshot((node("n1", "A100", 4, running),), quotas=quotas, now=now)
    return list(decide(snap, pending, evictions=evictions))


def a_borrows_two(**a3):
    """a holds 3 of 4 A100s (1 within quota, 2 borrowed), b 1: each deserves 2."""
    return {0: [mine("a1", "a")], 1: [mine("a2", "a", admission="borrowed", since=1)],
            2: [mine("a3", "a", admission="borrowed", **({"since": 2} | a3))], 3: [mine("b1", "b")]}


def test_a_reclaim_takes_the_share_already_warned_instead_of_warning_another():
    # a2 was warned for a request that no longer needs it: b's new request takes it (at its time),
    # though a3 is the newest, so no second job of a's is warned.
    running = a_borrows_two()
    running[1] = [mine("a2", "a", admission="borrowed", since=1, reclaim_at=1200)]
    (d,) = run(running, two_teams(grace=300), [asks("b2", "b")])
    assert isinstance(d, Reclaim) and d.victims == ("a2",) and d.due == {"a2": 1200}


def test_work_younger_than_the_minimum_run_time_is_not_taken_by_fair_share():
    running = a_borrows_two(since=1000 - MIN_RUN_S / 2)
    (d,) = run(running, two_teams(), [asks("b2", "b")])
    assert isinstance(d, Preemption) and d.victims == ("a2",)  # the older one, not the newest
    running[1] = [mine("a2", "a", admission="borrowed", since=1000 - MIN_RUN_S / 3)]
    (d,) = run(running, two_teams(), [asks("b2", "b")])
    assert isinstance(d, Unschedulable)
    (d,) = run(running, two_teams(), [asks("b2", "b")], now=1000 + MIN_RUN_S)
    assert isinstance(d, Preemption) and d.victims == ("a2",)  # both old enough now: the newest


def test_a_guaranteed_taker_evicts_young_borrowed_work():
    quotas = tree(Unit("a", quotas={"A100": q(1, 0)}, reclaim_grace_s=0), Unit("b", quotas={"A100": q(3, 0)}))
    running = a_borrows_two(since=999)
    running[1] = [mine("a2", "a", admission="borrowed", since=998)]
    (d,) = run(running, quotas, [asks("b2", "b")])
    assert isinstance(d, Preemption) and d.victims == ("a3",) and d.placement.admission == "guaranteed"


def test_a_job_evicted_twice_within_the_window_is_left_alone_for_the_next_window():
    twice = {"a3": [100.0, 900.0]}
    (d,) = run(a_borrows_two(), two_teams(), [asks("b2", "b")], now=1000, evictions=twice)
    assert isinstance(d, Preemption) and d.victims == ("a2",)
    (d,) = run(a_borrows_two(), two_teams(), [asks("b2", "b")], now=900 + EVICTION_WINDOW_S, evictions=twice)
    assert isinstance(d, Preemption) and d.victims == ("a3",)
    apart = {"a3": [100.0, 100.0 + 2 * EVICTION_WINDOW_S]}  # twice, but not within the window
    (d,) = run(a_borrows_two(), two_teams(), [asks("b2", "b")], now=200 + 2 * EVICTION_WINDOW_S, evictions=apart)
    assert isinstance(d, Preemption) and d.victims == ("a3",)


def test_a_job_evicted_twice_three_hours_apart_is_still_left_alone():
    # The jobs evicted most ran, waited and ran again in rounds of one to two hours: a one-hour
    # window never saw two of their evictions.
    twice = {"a3": [100.0, 100.0 + 3 * 3600]}
    (d,) = run(a_borrows_two(), two_teams(), [asks("b2", "b")], now=200 + 3 * 3600, evictions=twice)
    assert isinstance(d, Preemption) and d.victims == ("a2",)


def test_a_guaranteed_taker_evicts_a_job_however_often_it_was_evicted():
    quotas = tree(Unit("a", quotas={"A100": q(1, 0)}, reclaim_grace_s=0), Unit("b", quotas={"A100": q(3, 0)}))
    (d,) = run(a_borrows_two(), quotas, [asks("b2", "b")], evictions={"a3": [100.0, 900.0]})
    assert isinstance(d, Preemption) and d.victims == ("a3",)


def three_teams():
    """a and b have quotas of 2 and 1 A100s, c none (its priority-0 work runs opportunistically)."""
    return tree(Unit("a", quotas={"A100": q(2, 0)}), Unit("b", quotas={"A100": q(1, 0)}),
                Unit("c", quotas={"A100": q(0, 0)}, allow_over_quota=True))


def test_opportunistic_work_is_not_evicted_for_borrowed_work_of_a_team_at_its_share():
    # b holds 2 (1 borrowed) and deserves 2: its next request, borrowed, leaves c's priority-0 job alone.
    running = {0: [mine("a1", "a")], 1: [mine("b1", "b")], 2: [mine("b2", "b", admission="borrowed")],
               3: [mine("x1", "c", admission="opportunistic", priority=0)]}
    ds = run(running, three_teams(), [asks("b3", "b", priority=5), asks("c2", "c", priority=0)])
    assert isinstance(next(d for d in ds if getattr(d, "request_id", None) == "b3"), Unschedulable)


def test_opportunistic_work_makes_way_for_a_team_below_its_share():
    # b holds 1 and deserves 1.5: its borrowed request takes c's priority-0 job's place.
    running = {0: [mine("a1", "a")], 1: [mine("a2", "a")], 2: [mine("b1", "b")],
               3: [mine("x1", "c", admission="opportunistic", priority=0)]}
    ds = run(running, three_teams(), [asks("b3", "b", priority=5), asks("c2", "c", priority=0)])
    d = next(d for d in ds if getattr(d, "request_id", None) == "b3")
    assert isinstance(d, Preemption) and d.victims == ("x1",) and d.placement.admission == "borrowed"
