"""Fair share in the engine: admission per GPU model (guaranteed, borrowed, opportunistic, waits,
never), the fair-share order, the deserved share, and reclaim with its grace."""

from __future__ import annotations

import math

import pytest

from scheduler.core import (
    Admission,
    BucketQuota,
    Gpu,
    Limits,
    Node,
    Preemption,
    QuotaTree,
    Reclaim,
    Request,
    Share,
    Snapshot,
    Unit,
    Unschedulable,
    decide,
)
from scheduler.core.fairqueue import ledger_of
from scheduler.core.fairshare import demand_of
from scheduler.core.state import ClusterState

GIB = 1024


def q(share: float, memory_gib: float | None = None, gpus: int | None = None, *, borrow=None, lend=None,
      weight=1.0) -> BucketQuota:
    """A quota of `share` GPUs with the memory and GPU count that go with it (40 GiB cards)."""
    memory_gib = 40 * share if memory_gib is None else memory_gib
    gpus = math.ceil(share) if gpus is None else gpus
    return BucketQuota(round(share * 1000), round(memory_gib * GIB), gpus,
                       borrowing=borrow or Limits(), lending=lend or Limits(), weight=weight)


def node(name: str, model: str, n: int, shares: dict[int, list[Share]] | None = None) -> Node:
    shares = shares or {}
    return Node(name, tuple(Gpu(f"{name}-{j}", j, model, 40 * GIB, shares=tuple(shares.get(j, ())))
                            for j in range(n)))


def share(rid: str, team: str, gpu_request: float = 1.0, *, admission="guaranteed", priority=50, since=0.0,
          reclaim_at=None, memory_gib: float = 1) -> Share:
    return Share(rid, gpu_request, round(memory_gib * GIB), priority, team, admission=admission, since=since,
                 reclaim_at=reclaim_at)


def req(rid: str, team: str, gpu_request: float = 1.0, *, count=1, model=None, priority=50, created=0.0,
        memory_gib: float = 1) -> Request:
    return Request(rid, team, gpu_request, gpu_memory_mib=round(memory_gib * GIB), gpu_count=count,
                   gpu_model=model, priority=priority, created_at=created)


def tree(*units: Unit) -> QuotaTree:
    return QuotaTree(units)


def research(a_quota: BucketQuota, b_quota: BucketQuota, *, grace=300.0, dept=None) -> QuotaTree:
    d = {"*": dept} if dept else {}
    return tree(Unit("department:research", quotas=d, team=False),
                Unit("a", "department:research", {"A100": a_quota}, reclaim_grace_s=grace),
                Unit("b", "department:research", {"A100": b_quota}, reclaim_grace_s=grace))


def decisions(nodes, quotas, pending, now=1000.0):
    return list(decide(Snapshot(tuple(nodes), quotas=quotas, now=now), pending))


def placed(ds) -> dict[str, str]:
    """request id → admission of what was placed."""
    out = {}
    for d in ds:
        if isinstance(d, tuple):
            for p in d:
                out[p.request_id] = p.admission
        elif isinstance(d, Preemption):
            out[d.request_id] = d.placement.admission
    return out


def test_within_quota_is_guaranteed_beyond_it_borrows_from_an_idle_sibling():
    quotas = research(q(2), q(2))
    ds = decisions([node("n1", "A100", 4)], quotas, [req(f"a{i}", "a", created=i) for i in range(4)])
    assert placed(ds) == {"a0": "guaranteed", "a1": "guaranteed", "a2": "borrowed", "a3": "borrowed"}


def test_a_sibling_that_lends_nothing_keeps_its_quota_and_the_request_waits_saying_why():
    quotas = research(q(2), q(2, lend=Limits(0, 0, 0)))
    ds = decisions([node("n1", "A100", 4)], quotas, [req(f"a{i}", "a", created=i) for i in range(4)])
    assert placed(ds) == {"a0": "guaranteed", "a1": "guaranteed"}
    waits = {d.request_id: d for d in ds if isinstance(d, Unschedulable)}
    assert set(waits) == {"a2", "a3"}
    text = waits["a2"].reasons[0].message
    assert "a holds 2.0 of its 2.0 A100 GPU share quota and this needs 1.0" in text
    assert "others lend only 0.0 GPU share of A100 now" in text


def test_borrowing_limit_caps_what_a_team_may_hold_beyond_its_quota():
    quotas = research(q(1, borrow=Limits(1000, None, None)), q(4))
    ds = decisions([node("n1", "A100", 8)], quotas, [req(f"a{i}", "a", created=i) for i in range(4)])
    assert placed(ds) == {"a0": "guaranteed", "a1": "borrowed"}
    reason = next(d for d in ds if isinstance(d, Unschedulable) and d.request_id == "a2").reasons[0].message
    assert "team a is at its borrowing limit (2.0 of 2.0)" in reason


def test_beyond_the_hard_limit_can_never_run_unless_opportunistic():
    quotas = research(q(1, borrow=Limits(0, 0, 0)), q(4))
    ledger = ledger_of(ClusterState.from_snapshot(Snapshot((node("n1", "A100", 8),))), quotas)
    big = req("big", "a", 1.0, count=2)
    verdict = ledger.verdict("a", "A100", demand_of(big), big.priority)
    assert verdict.never and verdict.admission is None
    assert "team a may hold at most 1.0" in verdict.reason
    zero = req("zero", "a", 1.0, count=2, priority=0)
    assert ledger.verdict("a", "A100", demand_of(zero), 0).admission == Admission.OPPORTUNISTIC


def test_quotas_are_per_model_and_star_covers_the_others():
    quotas = tree(Unit("a", quotas={"A100": q(1), "*": q(2)}), Unit("b", quotas={"*": q(0, lend=Limits(0, 0, 0))}))
    nodes = [node("n1", "A100", 4), node("n2", "T4", 4)]
    pending = [req("a100-1", "a", model="A100"), req("a100-2", "a", model="A100", created=1),
               req("t4-1", "a", model="T4", created=2), req("t4-2", "a", model="T4", created=3),
               req("t4-3", "a", model="T4", created=4)]
    got = placed(decisions(nodes, quotas, pending))
    # A100 has its own quota of 1; T4 counts against `*` (2); b keeps nothing, so the rest borrows.
    assert got["a100-1"] == "guaranteed" and got["a100-2"] == "borrowed"
    assert [got[f"t4-{i}"] for i in (1, 2, 3)] == ["guaranteed", "guaranteed", "borrowed"]


def test_a_request_for_any_model_takes_the_model_where_it_is_guaranteed():
    quotas = tree(Unit("a", quotas={"T4": q(1)}), Unit("b", quotas={"A100": q(4)}))
    nodes = [node("n1", "A100", 4), node("n2", "T4", 4)]
    ds = decisions(nodes, quotas, [req("x", "a")])
    (p,) = ds[0]
    assert p.admission == "guaranteed" and p.node == "n2"


def test_priority_zero_beyond_quota_runs_opportunistic_where_nothing_can_be_borrowed():
    quotas = research(q(1), q(3, lend=Limits(0, 0, 0)))
    ds = decisions([node("n1", "A100", 4)], quotas,
                   [req("a0", "a"), req("a1", "a", priority=0, created=1)])
    assert placed(ds) == {"a0": "guaranteed", "a1": "opportunistic"}
    no = tree(Unit("department:research", team=False),
              Unit("a", "department:research", {"A100": q(1)}, allow_over_quota=False),
              Unit("b", "department:research", {"A100": q(3, lend=Limits(0, 0, 0))}))
    ds = decisions([node("n1", "A100", 4)], no, [req("a0", "a"), req("a1", "a", priority=0, created=1)])
    assert placed(ds) == {"a0": "guaranteed"}


def test_surplus_is_shared_by_weight_and_the_team_below_its_fair_share_goes_first():
    # 8 GPUs, quotas 1 + 1: 6 to share; weights 1 : 3, both want far more.
    quotas = tree(Unit("a", quotas={"A100": q(1, weight=1)}), Unit("b", quotas={"A100": q(1, weight=3)}))
    pending = [req(f"a{i}", "a", created=i) for i in range(8)] + [req(f"b{i}", "b", created=i) for i in range(8)]
    got = placed(decisions([node("n1", "A100", 8)], quotas, pending))
    assert len(got) == 8
    a = sum(1 for k in got if k.startswith("a"))
    assert (a, 8 - a) == (2, 6)  # 1 + 6/4 = 2.5 and 1 + 18/4 = 5.5: a rounds down, b takes the odd one
    ledger = ledger_of(ClusterState.from_snapshot(Snapshot((node("n1", "A100", 8),))), quotas)
    ledger.deserve(pending)
    assert ledger.deserved[("a", "A100")][0] == pytest.approx(2500)
    assert ledger.deserved[("b", "A100")][0] == pytest.approx(5500)


def test_fair_share_by_dominant_resource_counts_memory():
    # a asks for little compute and much memory: its dominant resource is memory.
    quotas = tree(Unit("a", quotas={"A100": q(0)}), Unit("b", quotas={"A100": q(0)}))
    pending = ([req(f"a{i}", "a", 0.1, memory_gib=20, created=i) for i in range(8)]
               + [req(f"b{i}", "b", 0.1, memory_gib=2, created=i) for i in range(8)])
    ledger = ledger_of(ClusterState.from_snapshot(Snapshot((node("n1", "A100", 4),))), quotas)
    ledger.deserve(pending)
    a, b = ledger.deserved[("a", "A100")], ledger.deserved[("b", "A100")]
    # Equal dominant shares: a's memory fraction equals b's compute-or-memory fraction.
    total_mem = 4 * 40 * GIB
    assert a[1] / total_mem == pytest.approx(max(b[0] / 4000, b[1] / total_mem), rel=1e-3)


def test_departments_share_by_subtree_and_a_transparent_department_passes_through():
    quotas = tree(Unit("department:x", quotas={"A100": q(2)}, team=False),
                  Unit("department:y", team=False),  # no rows: transparent
                  Unit("a", "department:x", {"A100": q(1)}), Unit("b", "department:x", {"A100": q(1)}),
                  Unit("c", "department:y", {"A100": q(2, lend=Limits(0, 0, 0))}))
    ledger = ledger_of(ClusterState.from_snapshot(Snapshot((node("n1", "A100", 4),))), quotas)
    assert quotas.path("c", "A100") == (("c", "A100"),)
    assert quotas.path("a", "A100") == (("a", "A100"), ("department:x", "A100"))
    # a may borrow b's idle quota and beyond x's, but c keeps its 2 (it lends nothing).
    amount = demand_of(req("a", "a", count=2))
    assert ledger.verdict("a", "A100", amount, 50).admission == Admission.BORROWED
    amount = demand_of(req("a", "a", count=3))
    assert ledger.verdict("a", "A100", amount, 50).admission is None


def test_within_quota_reclaims_borrowed_shares_after_the_lenders_grace():
    quotas = research(q(2), q(2), grace=300)
    running = {0: [share("b1", "b")], 1: [share("b2", "b")], 2: [share("b3", "b", admission="borrowed", since=5)],
               3: [share("b4", "b", admission="borrowed", since=9)]}
    nodes = [node("n1", "A100", 4, running)]
    ds = decisions(nodes, quotas, [req("a0", "a")], now=1000)
    (d,) = ds
    assert isinstance(d, Reclaim)
    assert d.victims == ("b4",)  # the newest borrowed share
    assert d.due == {"b4": 1300}
    # Once warned and due, the next cycle preempts it and places the request as guaranteed.
    running[3] = [share("b4", "b", admission="borrowed", since=9, reclaim_at=1300)]
    (d,) = decisions([node("n1", "A100", 4, running)], quotas, [req("a0", "a")], now=1300)
    assert isinstance(d, Preemption) and d.victims == ("b4",) and d.placement.admission == "guaranteed"


def test_reclaim_with_no_grace_preempts_at_once_and_never_takes_guaranteed_work():
    quotas = research(q(2), q(2), grace=0)
    running = {0: [share("b1", "b")], 1: [share("b2", "b")], 2: [share("a1", "a")],
               3: [share("b3", "b", admission="borrowed")]}
    (d,) = decisions([node("n1", "A100", 4, running)], quotas, [req("a2", "a", priority=1)])
    assert isinstance(d, Preemption) and d.victims == ("b3",)
    # Beyond its quota a request cannot reclaim: it waits.
    running[3] = [share("a2", "a")]
    (d,) = decisions([node("n1", "A100", 4, running)], quotas, [req("a3", "a", priority=100)])
    assert isinstance(d, Unschedulable)


def test_reclaim_takes_from_the_team_furthest_above_its_fair_share_first():
    quotas = tree(Unit("a", quotas={"A100": q(3)}), Unit("b", quotas={"A100": q(1)}),
                  Unit("c", quotas={"A100": q(0)}))
    # b holds 1 guaranteed + 1 borrowed, c holds 2 borrowed (its quota is 0: the most saturated).
    running = {0: [share("b1", "b")], 1: [share("b2", "b", admission="borrowed", since=50)],
               2: [share("c1", "c", admission="borrowed", since=1)],
               3: [share("c2", "c", admission="borrowed", since=2)]}
    quotas_now = QuotaTree([u if u.name != "a" else Unit("a", quotas={"A100": q(3)}, reclaim_grace_s=0)
                            for u in quotas.units.values()])
    quotas_now = QuotaTree([Unit(u.name, u.parent, u.quotas, u.team, reclaim_grace_s=0)
                            for u in quotas_now.units.values()])
    (d,) = decisions([node("n1", "A100", 4, running)], quotas_now, [req("a1", "a")])
    assert isinstance(d, Preemption) and d.victims == ("c2",)  # c's newest, not b's


def test_without_a_quota_tree_the_engine_decides_as_before():
    nodes = [node("n1", "A100", 2)]
    pending = [req("x", "a"), req("y", "b", created=1), req("z", "b", created=2)]
    ds = list(decide(Snapshot(tuple(nodes)), pending))
    assert placed(ds) == {"x": "guaranteed", "y": "guaranteed"}
    assert isinstance(ds[-1], Unschedulable)


def test_a_tree_with_a_cycle_or_a_missing_parent_is_refused():
    with pytest.raises(ValueError, match="cycle"):
        QuotaTree([Unit("department:x", "department:y", team=False), Unit("department:y", "department:x", team=False)])
    with pytest.raises(ValueError, match="not in the tree"):
        QuotaTree([Unit("a", "department:nowhere")])


def test_standings_say_who_borrows_and_who_lends():
    from scheduler.core.fairshare import standings

    quotas = research(q(2), q(2), dept=q(4))
    running = {0: [share("a1", "a")], 1: [share("a2", "a")], 2: [share("a3", "a", admission="borrowed")]}
    ledger = ledger_of(ClusterState.from_snapshot(Snapshot((node("n1", "A100", 4, running),))), quotas)
    by = {(s.unit, s.bucket): s for s in standings(ledger)}
    a, b = by[("a", "A100")], by[("b", "A100")]
    assert a.used[0] == 3000 and a.borrowed[0] == 1000 and a.lent == (0, 0, 0)
    assert b.used == (0, 0, 0) and b.borrowed == (0, 0, 0) and b.lent[0] == pytest.approx(1000)
    dept = by[("department:research", "*")]
    assert dept.used[0] == 3000 and dept.borrowed == (0, 0, 0)


def test_past_use_orders_the_team_that_used_more_lately_after_the_other():
    quotas = tree(Unit("a", quotas={"A100": q(1)}), Unit("b", quotas={"A100": q(1)}))
    pending = [req("a1", "a", created=0), req("b1", "b", created=1)]
    nodes = (node("n1", "A100", 1),)
    (first,) = [d for d in decide(Snapshot(nodes, quotas=quotas), pending) if isinstance(d, tuple)]
    assert first[0].request_id == "a1"  # equal standing: the older request
    ds = decide(Snapshot(nodes, quotas=quotas, past_use={"a": 900.0}), pending)
    (first,) = [d for d in ds if isinstance(d, tuple)]
    assert first[0].request_id == "b1"  # a used the card lately: b goes first


def test_a_priority_zero_request_within_its_quota_reclaims_priority_zero_borrowed_work():
    quotas = research(q(2), q(2), grace=0)
    running = {0: [share("b1", "b")], 1: [share("b2", "b")],
               2: [share("b3", "b", admission="borrowed", priority=0, since=1)],
               3: [share("b4", "b", admission="borrowed", priority=0, since=2)]}
    (d,) = decisions([node("n1", "A100", 4, running)], quotas, [req("a0", "a", priority=0)])
    assert isinstance(d, Preemption) and d.victims == ("b4",) and d.placement.admission == "guaranteed"
