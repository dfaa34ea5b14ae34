"""The fair cycle's shortcuts never change a decision (issue 23's cycle speed).

A reclaim by fair share is ruled out before its search when no victims it could find would leave
the request admitted once refunded (`Fair.reclaim_could_admit`, on `Ledger.refund_needed`); the
preemption search works out a node's option only when no other can come before it. Each is checked
three ways: the bound is a bound (hypothesis, on ledgers with borrowed shares), the cycle decides
the same with the bound as with every search run, and the same as the engine before these changes
(main at `BEFORE_SPEEDUPS`, from git), reasons and scores included.
"""

from __future__ import annotations

from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import Snapshot, decide
from scheduler.core.fairqueue import Fair, ledger_of
from scheduler.core.fairshare import COUNTED, ZERO, Admission, demand_of, vec_add, vec_le
from scheduler.core.state import ClusterState
from tests.scheduler.test_fairshare_properties import (
    FIRST,
    SECOND,
    after,
    cases,
    engine_at,
    seeded_cycle,
    to_old,
)

BEFORE_SPEEDUPS = "9b3964e"  # main before the fair cycle's search bounds
SLOW = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def main_engine(tmp_path_factory):
    return engine_at(BEFORE_SPEEDUPS, tmp_path_factory)


def two_cycles(case, engine=None) -> tuple[list, list]:
    """Both cycles of a case: the second on what the first left (its placements running as
    borrowed or guaranteed shares, so that the second reclaims by fair share)."""
    tree, nodes, first, second, drained = case
    ds = list(decide(Snapshot(tuple(nodes), quotas=tree, now=FIRST), first))
    nodes2 = after(nodes, first, ds, FIRST, drained)
    ds2 = list(decide(Snapshot(tuple(nodes2), quotas=tree, now=SECOND), second))
    if engine is None:
        return ds, ds2
    old = [list(engine.decide(to_old(Snapshot(tuple(n), quotas=tree, now=now), engine), to_old(queue, engine)))
           for n, now, queue in ((nodes, FIRST, first), (nodes2, SECOND, second))]
    return (ds, ds2), tuple(old)


def exact(decisions: list) -> list[str]:
    """Every field of every decision (placements with scores, victims, due times, reasons)."""
    return [repr(d) for d in decisions]


def unbounded():
    """Every reclaim by fair share runs its search (the bound answers: it could admit)."""
    return patch.object(Fair, "reclaim_could_admit", lambda self, req, models: True)


# ---- the bound is a bound -----------------------------------------------------------------------
@SLOW
@given(case=cases(), data=st.data())
def test_nothing_given_back_below_refund_needed_admits_the_request(case, data):
    """Whatever counted shares are refunded, a request admitted afterwards (guaranteed without
    reclaim, or borrowed) had at least one of `refund_needed`'s thresholds covered by the total
    refunded, per resource."""
    tree, nodes, first, _, _ = case
    ds = list(decide(Snapshot(tuple(nodes), quotas=tree, now=FIRST), first))
    snap = Snapshot(tuple(after(nodes, first, ds, FIRST, set())), quotas=tree, now=SECOND)
    ledger = ledger_of(ClusterState.from_snapshot(snap), tree)
    teams = sorted(u.name for u in tree.units.values() if u.team)
    held = sorted(ledger.holdings)
    for _ in range(4):
        team = data.draw(st.sampled_from(teams))
        model = data.draw(st.sampled_from(ledger.models)) if ledger.models else None
        if model is None:
            return
        req_amount = demand_of(data.draw(st.sampled_from(first + [r for r in case[3]])))
        priority = data.draw(st.sampled_from([0, 10, 100]))
        thresholds = [t for t in ledger.refund_needed(team, model, req_amount) if t is not None]
        gone = data.draw(st.lists(st.sampled_from(held), unique=True, max_size=4)) if held else []
        entries = {rid: ledger.holdings[rid] for rid in gone}
        total = ZERO
        for rid, (_, _, amount, admission) in entries.items():
            ledger.refund(rid)
            if admission in COUNTED:
                total = vec_add(total, amount)
        v = ledger.verdict(team, model, req_amount, priority)
        if v.admission in (Admission.GUARANTEED, Admission.BORROWED) and not v.reclaim:
            assert any(vec_le(t, total) for t in thresholds), (team, model, req_amount, total, thresholds, v)
        for rid, entry in entries.items():
            ledger.charge(rid, *entry)


# ---- the cycle decides the same -----------------------------------------------------------------
@SLOW
@given(case=cases())
def test_the_reclaim_bound_never_changes_a_decision(case):
    """With the bound, the same decisions as running every reclaim by fair share's search."""
    bounded = two_cycles(case)
    with unbounded():
        searched = two_cycles(case)
    assert [exact(d) for d in bounded] == [exact(d) for d in searched]


@SLOW
@given(case=cases())
def test_the_fair_cycle_decides_as_before_the_speedups(case, main_engine):
    """The same decisions, in the same order, as main's engine before these changes."""
    now, before = two_cycles(case, main_engine)
    assert [exact(d) for d in now] == [exact(d) for d in before]


def test_a_seeded_cycle_decides_as_before_the_speedups_and_the_bound_rules_out_searches(main_engine):
    """A smaller cycle_speed bench (24 teams, 30 nodes, two queues of 250): the bound rules out
    some reclaims' searches, and the decisions are those of every search run and of main's engine."""
    tree, nodes, first, second = seeded_cycle()
    case = (tree, nodes, first, second, {"n0"})
    ruled_out = []
    bound = Fair.reclaim_could_admit

    def counting(self, req, models):
        could = bound(self, req, models)
        if not could:
            ruled_out.append(req.id)
        return could

    with patch.object(Fair, "reclaim_could_admit", counting):
        bounded = two_cycles(case)
    with unbounded():
        searched = two_cycles(case)
    now, before = two_cycles(case, main_engine)
    assert ruled_out  # the bound did rule out searches here
    assert [exact(d) for d in bounded] == [exact(d) for d in searched] == [exact(d) for d in now]
    assert [exact(d) for d in now] == [exact(d) for d in before]
