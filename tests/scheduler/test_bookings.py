"""Bookings in the engine: room held ahead of a window (warnings, then the reclaim at its start),
guaranteed work never moved for one, placement around bookings (long work off booked GPUs, short
work into the gap before a window), and the same decisions as before when there are none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core import Preemption, Reclaim, Snapshot, decide
from scheduler.core.bookings import Booking
from tests.scheduler.test_fairshare import decisions, node, placed, q, req, research, share

HOUR = 3600.0
NOW = 10 * HOUR
GIB = 1024


def booking(bid="900", team="a", *, count=1, gpu_request=1.0, starts_in=600.0, hours=2.0, lead=900.0, model="A100"):
    return Booking(bid, team, model, gpu_request, GIB, count, NOW + starts_in, NOW + starts_in + hours * HOUR, lead)


def cycle(nodes, quotas, pending=(), bookings=(), durations=None, now=NOW):
    return list(decide(Snapshot(tuple(nodes), quotas=quotas, now=now, bookings=tuple(bookings),
                                durations=durations or {}), list(pending)))


def reclaims(ds) -> list[Reclaim]:
    return [d for d in ds if isinstance(d, Reclaim)]


def where(ds) -> dict[str, tuple[str, tuple[int, ...]]]:
    out = {}
    for d in ds:
        for p in (d if isinstance(d, tuple) else (d.placement,) if isinstance(d, Preemption) else ()):
            out[p.request_id] = (p.node, p.gpu_indexes)
    return out


QUOTAS = research(q(2), q(2))  # a and b: 2 A100s each of a fleet of 4


def test_borrowed_work_in_the_way_is_warned_within_the_lead_time():
    # b borrows all four GPUs; a booked one GPU from in 10 minutes, its lead is 15.
    nodes = [node("n1", "A100", 4, {j: [share(f"{j + 1}", "b", admission="borrowed", since=0)] for j in range(4)})]
    got = reclaims(cycle(nodes, QUOTAS, bookings=[booking(starts_in=600)]))
    assert len(got) == 1
    r = got[0]
    assert r.kind == "booking" and r.request_id == "900"
    assert len(r.victims) == 1 and r.due == {r.victims[0]: NOW + 600}
    assert "capacity booked by team a from" in r.reasons[0].message


def test_nothing_is_warned_before_the_lead_time():
    nodes = [node("n1", "A100", 4, {j: [share(f"{j + 1}", "b", admission="borrowed", since=0)] for j in range(4)})]
    assert reclaims(cycle(nodes, QUOTAS, bookings=[booking(starts_in=2 * HOUR)])) == []
    # the lead is the team's grace: a longer one warns earlier
    assert reclaims(cycle(nodes, QUOTAS, bookings=[booking(starts_in=2 * HOUR, lead=3 * HOUR)]))


def test_opportunistic_work_is_warned_too():
    nodes = [node("n1", "A100", 2, {0: [share("1", "a")], 1: [share("2", "b", admission="opportunistic",
                                                                      priority=0)]})]
    (r,) = reclaims(cycle(nodes, research(q(1), q(1)), bookings=[booking(team="b", starts_in=300)]))
    assert r.victims == ("2",)


def test_another_teams_guaranteed_work_is_never_evicted_for_a_booking():
    # Every GPU holds guaranteed work within its team's quota: b's booking warns nobody.
    nodes = [node("n1", "A100", 4, {0: [share("1", "a")], 1: [share("2", "a")], 2: [share("3", "b")],
                                    3: [share("4", "b")]})]
    ds = cycle(nodes, QUOTAS, bookings=[booking(team="c", starts_in=60)])
    assert reclaims(ds) == []
    assert not any(isinstance(d, Preemption) for d in ds)


def test_a_booking_takes_its_own_teams_work_beyond_its_quota():
    # a holds its whole quota (2) and booked one more GPU: counted with the booking, a's running
    # work is beyond its quota, so one of a's shares (the newest: least work lost) is warned, never b's.
    nodes = [node("n1", "A100", 4, {0: [share("1", "a", since=NOW - HOUR)], 1: [share("2", "a", since=NOW - 60)],
                                    2: [share("3", "b")], 3: [share("4", "b")]})]
    (r,) = reclaims(cycle(nodes, QUOTAS, bookings=[booking(starts_in=60)]))
    assert r.victims == ("2",)


def test_another_schedulers_share_is_never_a_victim_of_a_booking():
    # A kube-scheduler's claim counted in team a's quota: the newest of a's work, so the own-team
    # rule would pick it first; it is nobody's reservation here and stays. a's own share goes.
    claim = replace(share("claim ns/x", "a", since=NOW - 60, priority=100), external=True)
    nodes = [node("n1", "A100", 4, {0: [share("1", "a", since=NOW - HOUR)], 1: [claim],
                                    2: [share("3", "b")], 3: [share("4", "b")]})]
    (r,) = reclaims(cycle(nodes, QUOTAS, bookings=[booking(starts_in=60)]))
    assert r.victims == ("1",)
    # A whole-node booking where the claim's GPU is the only one missing: the claim is not warned.
    nodes = [node("n1", "A100", 2, {0: [claim], 1: [share("2", "b", admission="borrowed")]})]
    got = reclaims(cycle(nodes, research(q(2), q(2)), bookings=[booking(team="b", count=2, starts_in=600)]))
    assert all(v != "claim ns/x" for r in got for v in r.victims)


def test_a_whole_node_booking_clears_the_node_with_the_fewest_guaranteed_shares():
    # A 4-GPU booking needs one node. Each node has one guaranteed share and GPUs that borrowed
    # work holds: the room exists in total (6 GPUs hold no guaranteed work), on no node whole.
    # n2's guaranteed share is one of two there; n1 has one, n3 has one that has run longest.
    def borrowed(rid):
        return [share(rid, "b", admission="borrowed", since=NOW - 60)]

    nodes = [node("n1", "A100", 4, {0: [share("1", "a", since=NOW - 600)], 1: borrowed("11"), 2: borrowed("12")}),
             node("n2", "A100", 4, {0: [share("2", "a", since=NOW - 60)], 1: [share("3", "b", since=NOW - 60)],
                                    2: borrowed("21")}),
             node("n3", "A100", 4, {0: [share("4", "b", since=NOW - 3 * HOUR)], 3: borrowed("31")})]
    quotas = research(q(4), q(8))
    (r,) = reclaims(cycle(nodes, quotas, bookings=[booking(count=4, starts_in=600)]))
    # n1 and n3 cost one guaranteed share each; n1's has run 10 minutes, n3's three hours
    assert set(r.victims) == {"1", "11", "12"}
    assert r.due == {v: NOW + 600 for v in r.victims}


def test_guaranteed_work_stays_where_the_room_is_missing_in_total():
    # Three GPUs hold guaranteed work, one borrowed: c's 2-GPU booking has no room even in total
    # (the booking check would not have taken it): nothing guaranteed is warned for it.
    nodes = [node("n1", "A100", 2, {0: [share("1", "a")], 1: [share("2", "b", admission="borrowed")]}),
             node("n2", "A100", 2, {0: [share("3", "b")], 1: [share("4", "b")]})]
    got = reclaims(cycle(nodes, research(q(2), q(2)), bookings=[booking(team="c", count=2, starts_in=600)]))
    assert all(v == "2" for r in got for v in r.victims)


def test_a_later_whole_node_booking_keeps_long_work_off_its_node():
    # Both nodes have guaranteed work on one GPU; a 2-GPU booking in 3 hours is planned on the node
    # whose work is cheaper to move, and new work of unknown end goes to the other one.
    nodes = [node("n1", "A100", 3, {0: [share("1", "a", since=NOW - 60)]}),
             node("n2", "A100", 3, {0: [share("2", "a", since=NOW - 2 * HOUR)]})]
    quotas = research(q(4), q(4))
    without = where(cycle(nodes, quotas, [req("5", "b", count=2)]))
    got = where(cycle(nodes, quotas, [req("5", "b", count=2)], bookings=[booking(count=3, starts_in=3 * HOUR)]))
    assert got["5"][0] == "n2" and without["5"][0] == "n1"


def test_held_room_takes_no_new_work_and_is_reclaimed_at_the_start():
    nodes = [node("n1", "A100", 2, {0: [share("1", "b", admission="borrowed", since=0)]})]
    quotas = research(q(1), q(1))
    b = booking(starts_in=300, count=2)
    ds = cycle(nodes, quotas, [req("5", "b", created=NOW - 10)], bookings=[b])
    (r,) = reclaims(ds)
    assert r.victims == ("1",)
    assert "5" not in placed(ds)  # the free GPU is held for the window: b's new work waits
    # At the start the portal makes the booking a pending request; the warned share goes at once.
    warned = [node("n1", "A100", 2, {0: [share("1", "b", admission="borrowed", since=0, reclaim_at=b.starts_at)]})]
    start = replace(req("900", "a", count=2, model="A100"), created_at=b.starts_at)
    ds = decisions(warned, research(q(2), q(1)), [start], now=b.starts_at)
    (p,) = [d for d in ds if isinstance(d, Preemption)]
    assert p.request_id == "900" and p.victims == ("1",)


def test_long_work_goes_where_no_booking_will_need_it():
    # Two free GPUs; a booking in 3 hours is planned on one of them. Work of unknown end avoids it,
    # whichever GPU the scorer liked before.
    nodes = [node("n1", "A100", 1), node("n2", "A100", 1)]
    quotas = research(q(2), q(2))
    without = where(cycle(nodes, quotas, [req("1", "b", 0.5)]))
    booked = booking(starts_in=3 * HOUR, gpu_request=0.75)
    plan_node = "n1" if without["1"][0] == "n1" else "n2"  # the booking takes the same best fit
    got = where(cycle(nodes, quotas, [req("1", "b", 0.5)], bookings=[booked]))
    assert got["1"][0] != plan_node
    # and with a known end after the window too
    got = where(cycle(nodes, quotas, [req("1", "b", 0.5)], bookings=[booked], durations={"1": 4 * HOUR}))
    assert got["1"][0] != plan_node


def test_backfill_puts_the_short_job_in_the_gap_before_the_window():
    nodes = [node("n1", "A100", 1), node("n2", "A100", 1)]
    quotas = research(q(2), q(2))
    booked = booking(starts_in=3 * HOUR, gpu_request=0.75)
    pending = [req("1", "b", 0.5, created=NOW - 20), req("2", "b", 0.5, created=NOW - 10)]
    got = where(cycle(nodes, quotas, pending, bookings=[booked], durations={"1": 5 * HOUR, "2": HOUR}))
    long_node, short_node = got["1"][0], got["2"][0]
    assert long_node != short_node
    # the short one sits on the booked GPU, the long one elsewhere, whichever is queued first
    got2 = where(cycle(nodes, quotas, pending, bookings=[booked], durations={"1": HOUR, "2": 5 * HOUR}))
    assert got2["1"][0] == short_node and got2["2"][0] == long_node


def test_two_bookings_never_plan_on_the_same_room():
    nodes = [node("n1", "A100", 2, {0: [share("1", "b", admission="borrowed", since=0)],
                                    1: [share("2", "b", admission="borrowed", since=0)]})]
    got = reclaims(cycle(nodes, QUOTAS, bookings=[booking("900", starts_in=300), booking("901", starts_in=400)]))
    assert {r.request_id for r in got} == {"900", "901"}
    assert set(got[0].victims).isdisjoint(got[1].victims)


def test_a_booking_without_its_model_changes_nothing():
    nodes = [node("n1", "A100", 1, {0: [share("1", "b", admission="borrowed", since=0)]})]
    assert reclaims(cycle(nodes, QUOTAS, bookings=[booking(model="H100", starts_in=60)])) == []


@pytest.mark.parametrize("bad", [dict(gpu_count=0), dict(gpu_request=0.0), dict(gpu_count=2, gpu_request=0.5),
                                 dict(ends_at=NOW), dict(lead_s=-1.0), dict(gpu_model="")])
def test_invalid_bookings_are_refused_naming_the_field(bad):
    fields = dict(id="1", team="a", gpu_model="A100", starts_at=NOW, ends_at=NOW + HOUR) | bad
    with pytest.raises(ValueError, match="booking 1"):
        Booking(**fields)


def test_decisions_without_bookings_are_unchanged():
    nodes = [node("n1", "A100", 2, {0: [share("1", "b", admission="borrowed", since=0)]}), node("n2", "A100", 2)]
    pending = [req(str(i), "ab"[i % 2], 0.25 * (1 + i % 4), created=NOW - i) for i in range(2, 9)]
    before = cycle(nodes, QUOTAS, pending)
    # a booking whose window has ended, and one of a model the fleet lacks, are no bookings at all
    gone = [booking(starts_in=-3 * HOUR, hours=1), booking("901", model="H100")]
    assert cycle(nodes, QUOTAS, pending, bookings=gone) == before


# ---- the forecast ---------------------------------------------------------------------------------
def test_the_estimated_start_moves_with_a_booking():
    from scheduler.core.forecast import estimate_starts

    nodes = [node("n1", "A100", 1, {0: [share("1", "b", since=0)]})]
    waiting = [req("2", "b", created=NOW)]
    ends = {"1": NOW + HOUR}
    plain = estimate_starts(Snapshot(tuple(nodes), now=NOW), waiting, ends, now=NOW)
    assert plain["2"].start == NOW + HOUR
    # a booking from in 30 minutes to in 3 hours takes the GPU as soon as it is free
    b = booking(starts_in=1800, hours=2.5)
    got = estimate_starts(Snapshot(tuple(nodes), now=NOW, bookings=(b,)), waiting, ends, now=NOW)
    assert got["2"].start == b.ends_at
    # a booking on another model, or one that ended, moves nothing
    other = booking(model="H100")
    assert estimate_starts(Snapshot(tuple(nodes), now=NOW, bookings=(other,)), waiting, ends, now=NOW)["2"].start \
        == NOW + HOUR


def test_the_forecast_holds_a_booking_whose_lead_has_begun():
    from scheduler.core.forecast import estimate_starts

    nodes = [node("n1", "A100", 2, {0: [share("1", "b", since=0)]})]
    waiting = [req("2", "b", created=NOW)]
    ends = {"1": NOW + HOUR}
    assert estimate_starts(Snapshot(tuple(nodes), now=NOW), waiting, ends, now=NOW)["2"].start == NOW
    b = booking(starts_in=300, hours=2)  # its room is held from now: the free GPU is taken
    got = estimate_starts(Snapshot(tuple(nodes), now=NOW, bookings=(b,)), waiting, ends, now=NOW)
    assert got["2"].start == NOW + HOUR


# ---- at the start and while the window runs --------------------------------------------------------
def test_a_started_booking_takes_its_room_before_the_queue():
    # The window began: its request waits beside another team's older guaranteed request, and the
    # one GPU is held by work warned for the booking. The booking's request goes first, evicting it.
    b = booking("900", "a", starts_in=-30)
    nodes = [node("n1", "A100", 1, {0: [share("1", "c", admission="borrowed", since=0, reclaim_at=b.starts_at)]})]
    quotas = research(q(1), q(1))
    pending = [req("5", "b", created=NOW - 3000), replace(req("900", "a", model="A100"), created_at=b.starts_at)]
    ds = cycle(nodes, quotas, pending, bookings=[b])
    first = next(d for d in ds if isinstance(d, Preemption | tuple))
    assert isinstance(first, Preemption) and first.request_id == "900" and first.victims == ("1",)
    assert first.placement.admission == "guaranteed"
    assert "5" not in placed(ds)


def test_a_running_window_is_nobodys_victim():
    # a's booked job (priority 1) runs in its window; a's own priority-50 request would evict it
    # without the booking (within a team, priorities order work).
    nodes = [node("n1", "A100", 1, {0: [share("900", "a", priority=1, since=0)]})]
    quotas = research(q(2), q(0))
    pending = [req("5", "a", created=NOW - 10)]
    assert any(isinstance(d, Preemption) for d in cycle(nodes, quotas, pending))
    running = booking("900", "a", starts_in=-600)
    ds = cycle(nodes, quotas, pending, bookings=[running])
    assert not any(isinstance(d, Preemption) for d in ds)
    # once the window is over it is ordinary work again
    over = booking("900", "a", starts_in=-3 * HOUR, hours=1)
    assert any(isinstance(d, Preemption) for d in cycle(nodes, quotas, pending, bookings=[over]))


def test_a_held_booking_counts_against_its_teams_quota():
    # a's quota is 2 A100s; it runs one, and its booking of one more begins its lead time. A new
    # request of a's would take a beyond its quota once the window starts: it borrows (and may be
    # reclaimed), where without the booking it would be guaranteed.
    nodes = [node("n1", "A100", 4, {0: [share("1", "a")]})]
    quotas = research(q(2), q(2))
    assert placed(cycle(nodes, quotas, [req("5", "a", created=NOW - 10)])) == {"5": "guaranteed"}
    got = placed(cycle(nodes, quotas, [req("5", "a", created=NOW - 10)], bookings=[booking(starts_in=600)]))
    assert got == {"5": "borrowed"}
    # a booking whose lead has not begun takes nothing from the quota yet
    later = placed(cycle(nodes, quotas, [req("5", "a", created=NOW - 10)], bookings=[booking(starts_in=3 * HOUR)]))
    assert later == {"5": "guaranteed"}


def test_a_started_booking_whose_pod_needs_more_cpu_than_its_room_clears_room_where_it_fits():
    # The room held for the window is on n1, where a borrowed share is free of charge to take; but
    # the booking's pod asks for 8 CPUs and n1 has 2 left. n2 has them, under b's borrowed work:
    # the request clears n2 at its start instead of waiting in the queue for a reclaim's grace.
    b = booking("900", "a", starts_in=-30)
    n1 = replace(node("n1", "A100", 1, {0: [share("1", "c", admission="borrowed", since=0)]}), cpu_milli_free=2000)
    n2 = replace(node("n2", "A100", 1, {0: [share("2", "b", admission="borrowed", since=0)]}), cpu_milli_free=8000)
    start = replace(req("900", "a", model="A100"), created_at=b.starts_at, cpu_milli=8000)
    ds = cycle([n1, n2], research(q(1), q(1)), [start], bookings=[b])
    (p,) = [d for d in ds if isinstance(d, Preemption)]
    assert p.request_id == "900" and p.victims == ("2",) and p.placement.node == "n2"
