"""The cycle's speed work changes no decision but one tie rule: the engine decides seeded cycles
exactly as the engine before the speed work did, with a quota tree as FAIR_BEFORE (the last commit
that changed fair-share decisions on purpose: the 4 h eviction window) and
without one as FLAT_BEFORE (before the label indexes and the pruned preemption search). A change that means to change
decisions moves the anchor it changes to the commit that made it.

The tie rule: victims on one GPU that rank equal and are of equal size go in the order they were
first placed. The engine before broke that tie by its placement dict's order, where a rolled-back
preemption option put its victims last; now a rollback changes nothing (Holding.order). Fair cycles
never tie (their rank ends with the reservation id), so they are compared with the engine before as
it was; flat cycles (rank: priority) with the engine before, its rollback made to keep the order.

The workloads are small bench/fairshare/cycle_speed.py cycles that reach every part that changed:
exclusion, affinity and anti-affinity labels on shares and requests, nodes short of CPU and memory
(where a preemption option fails the filters), draining nodes, several teams and priorities,
borrowed and opportunistic shares (preemption and reclaim), gangs and multi-GPU requests.
"""

from __future__ import annotations

import numpy as np
import pytest

from scheduler import core
from tests.scheduler.test_fairshare_properties import engine_at

FAIR_BEFORE = "4362729"  # 4 h eviction window (nodes kept apart off): the latest change of fair-share decisions
FLAT_BEFORE = "aa9af83"  # before the label indexes and the pruned preemption search
MODELS = ("A", "B")
TEAMS = tuple(f"t{i}" for i in range(6))
NOW = 10_000.0


def workload(c, seed: int, quotas: bool):
    """One seeded snapshot and queue, built from engine module `c`'s classes."""
    rng = np.random.default_rng(seed)
    label = lambda p, *names: frozenset({str(rng.choice(names))}) if rng.random() < p else frozenset()  # noqa: E731
    nodes, sid = [], 0
    for n in range(24):
        model, gpus = MODELS[n % 2], []
        for j in range(int(rng.choice([1, 2, 4, 8]))):
            shares, used = [], 0
            excl = label(0.2, "x", "y")
            while rng.random() < 0.7:
                size = float(rng.choice([0.1, 0.25, 0.5, 1.0]))
                if used + round(size * 1000) > 1000:
                    break
                used, sid = used + round(size * 1000), sid + 1
                shares.append(c.Share(f"{sid}", size, int(rng.choice([0, 1000, 4000])),
                                      priority=int(rng.choice([0, 0, 10, 50])), team=str(rng.choice(TEAMS)),
                                      affinity=label(0.1, "a1", "a2"), anti_affinity=label(0.1, "z1", "z2"),
                                      exclusion=excl, admission=str(rng.choice(["guaranteed", "borrowed",
                                                                                 "opportunistic"])),
                                      since=NOW - float(rng.integers(0, 5000))))
            gpus.append(c.Gpu(f"n{n}g{j}", j, model, 16_000, shares=tuple(shares)))
        nodes.append(c.Node(f"n{n}", tuple(gpus),
                            status=c.NodeStatus.DRAINING if rng.random() < 0.05 else c.NodeStatus.READY,
                            cpu_milli_free=None if rng.random() < 0.3 else int(rng.choice([500, 4000, 64_000])),
                            memory_mib_free=None if rng.random() < 0.3 else int(rng.choice([2000, 256_000]))))
    pending = []
    while len(pending) < 400:
        team, priority = str(rng.choice(TEAMS)), int(rng.choice([0, 10, 20, 50, 80]))
        common = dict(team=team, priority=priority, gpu_model=rng.choice([None, None, "A", "B", "A|B"]),
                      affinity=label(0.05, "a1", "a2"), anti_affinity=label(0.05, "z1", "z2"),
                      exclusion=label(0.1, "x", "y"), created_at=NOW - float(rng.integers(0, 3600)),
                      cpu_milli=int(rng.choice([0, 1000, 8000])), memory_mib=int(rng.choice([0, 4000])))
        if rng.random() < 0.02:
            group = c.PodGroup(f"g{len(pending)}", headcount=2)
            pending += [c.Request(f"r{len(pending) + k}", gpu_request=1.0, group=group, **common) for k in range(2)]
            continue
        count = int(rng.choice([1, 1, 1, 1, 2]))
        pending.append(c.Request(f"r{len(pending)}", gpu_request=1.0 if count > 1 else float(
            rng.choice([0.1, 0.25, 0.5, 0.7, 1.0])), gpu_count=count,
            gpu_memory_mib=int(rng.choice([0, 2000, 8000])), **common))
    tree = None
    if quotas:
        row = lambda gpus, borrow: c.BucketQuota(gpus * 1000, gpus * 16_000, gpus,  # noqa: E731
                                                 borrowing=c.Limits(borrow, None, None))
        tree = c.QuotaTree([c.Unit("department:d", quotas={"*": row(40, 8000)}, team=False),
                            *(c.Unit(t, "department:d" if i % 2 else "",
                                     {"A": row(int(rng.integers(2, 16)), int(rng.integers(0, 4000))),
                                      "*": row(int(rng.integers(2, 16)), None)},
                                     reclaim_grace_s=float(rng.choice([0, 300])))
                              for i, t in enumerate(TEAMS))])
    return c.Snapshot(tuple(nodes), now=NOW, quotas=tree), pending


def plain(decisions: list) -> list:
    """Decisions as plain tuples, whichever engine's classes they are: every field a user sees."""
    reasons = lambda rs: tuple((str(r.code), r.message, r.count) for r in rs)  # noqa: E731
    out = []
    for d in decisions:
        kind = type(d).__name__
        if isinstance(d, tuple):
            out.append(("placed", tuple((p.request_id, p.node, p.gpu_uuids, p.gpu_request, p.score, p.group,
                                         p.admission) for p in d)))
        elif kind == "Preemption":
            p = d.placement
            out.append(("preempt", d.request_id, d.victims, p.node, p.gpu_uuids, p.admission))
        elif kind == "Reclaim":
            out.append(("reclaim", d.request_id, d.victims, tuple(sorted(d.due.items())), reasons(d.reasons)))
        else:
            out.append(("waits", d.request_id, reasons(d.reasons)))
    return out


@pytest.fixture(scope="module")
def before(tmp_path_factory):
    return engine_at(FAIR_BEFORE, tmp_path_factory)


@pytest.fixture(scope="module")
def flat_before(tmp_path_factory):
    return engine_at(FLAT_BEFORE, tmp_path_factory)


@pytest.fixture
def before_with_first_placed_ties(flat_before, monkeypatch):
    """The engine before, with the tie rule: its preemption search reads `placed` in order and
    breaks ties by it, so its rollback (`restore`) puts a share back where it was first placed."""
    cls = flat_before.state.ClusterState
    release, restore = cls.release, cls.restore

    def numbered(state) -> dict[str, int]:
        # Numbered at each release: every share not yet numbered is in first-placement order
        # (only a restore, which comes after a release, moves one).
        first = state.__dict__.setdefault("first_placed", {})
        for rid in state.placed:
            first.setdefault(rid, len(first))
        return first

    def release_keeping(state, reservation_id):
        numbered(state)
        return release(state, reservation_id)

    def restore_in_place(state, rec):
        restore(state, rec)
        first = numbered(state)
        state.placed = dict(sorted(state.placed.items(), key=lambda item: first[item[0]]))

    monkeypatch.setattr(cls, "release", release_keeping)
    monkeypatch.setattr(cls, "restore", restore_in_place)
    return flat_before


def assert_decides_as(engine, seed: int, quotas: bool) -> None:
    now = plain(core.decide(*workload(core, seed, quotas)))
    then = plain(engine.decide(*workload(engine, seed, quotas)))
    assert now == then
    kinds = {d[0] for d in now}
    assert {"placed", "preempt", "waits"} <= kinds  # the cycle reached preemption, and some wait


@pytest.mark.parametrize("seed", range(6))
def test_fair_cycles_decide_as_before_the_speed_work(seed, before):
    assert_decides_as(before, seed, quotas=True)


@pytest.mark.parametrize("seed", range(6))
def test_flat_cycles_decide_as_before_with_ties_by_first_placement(seed, before_with_first_placed_ties):
    assert_decides_as(before_with_first_placed_ties, seed, quotas=False)
