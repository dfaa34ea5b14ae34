"""The deserved share never promises more than there is or more than a team asks for."""

from __future__ import annotations

import pytest

from scheduler.core import Snapshot, Unit
from scheduler.core.fairqueue import ledger_of
from scheduler.core.state import ClusterState
from tests.scheduler.test_fairshare import node, q, req, share, tree


def deserved(nodes, quotas, pending) -> dict[tuple[str, str], float]:
    """(team, model) → deserved GPU share (1.0 a GPU)."""
    ledger = ledger_of(ClusterState.from_snapshot(Snapshot(tuple(nodes))), quotas)
    ledger.deserve(pending)
    return {k: v[0] / 1000 for k, v in ledger.deserved.items()}


def test_when_quotas_cover_the_fleet_no_team_deserves_beyond_it():
    # Quotas 2 + 2 of 4 GPUs, both teams want 8 whole GPUs (no memory asked): nothing is left to
    # share beyond the quotas, so each deserves its quota, not all it asks for.
    quotas = tree(Unit("a", quotas={"A100": q(2)}), Unit("b", quotas={"A100": q(2)}))
    pending = [req(f"{t}{i}", t, memory_gib=0, created=i) for t in "ab" for i in range(8)]
    got = deserved([node("n1", "A100", 4)], quotas, pending)
    assert got[("a", "A100")] == pytest.approx(2)
    assert got[("b", "A100")] == pytest.approx(2)


def test_a_request_for_any_model_counts_once_toward_the_team_models_by_its_quota():
    # a has quota on A100 only; its any-model requests count there, not on V100 as well.
    quotas = tree(Unit("a", quotas={"A100": q(2)}), Unit("b", quotas={"V100": q(2)}))
    nodes = [node("n1", "A100", 2), node("n2", "V100", 2)]
    pending = [req(f"a{i}", "a", created=i) for i in range(2)] + [req("b0", "b", model="V100")]
    got = deserved(nodes, quotas, pending)
    assert got[("a", "A100")] == pytest.approx(2)
    assert got.get(("a", "V100"), 0) == 0
    assert got[("b", "V100")] == pytest.approx(1)


def test_what_a_team_deserves_adds_up_to_no_more_than_it_holds_and_waits_for():
    quotas = tree(Unit("a", quotas={"A100": q(1), "V100": q(1)}), Unit("b", quotas={"A100": q(1)}))
    running = {0: [share("a1", "a")]}
    nodes = [node("n1", "A100", 2, running), node("n2", "V100", 2)]
    pending = [req("a2", "a"), req("a3", "a", 0.5), req("b0", "b", count=2, model="A100")]
    got = deserved(nodes, quotas, pending)
    assert got[("a", "A100")] + got.get(("a", "V100"), 0) <= 2.5 + 1e-9
    assert sum(got.values()) <= 4 + 1e-9
