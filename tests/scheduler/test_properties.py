"""Invariants over random clusters and request streams (hypothesis, bounded)."""

from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import (
    POLICIES,
    FleetLayout,
    Gpu,
    Node,
    NodeStatus,
    PodGroup,
    Preemption,
    Request,
    Share,
    Snapshot,
    Unschedulable,
    best_gpus,
    decide,
    schedule,
)
from scheduler.core.model import to_milli
from scheduler.core.state import ClusterState

LABELS = st.sampled_from(["x", "y"])
SHARES = st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.7, 1.0])


@st.composite
def clusters(draw):
    nodes = []
    sid = 0
    for n in range(draw(st.integers(1, 4))):
        gpus = []
        for j in range(draw(st.integers(1, 4))):
            memory = draw(st.sampled_from([8000, 16000]))
            shares, used, used_mem = [], 0, 0
            excl = draw(st.sampled_from([frozenset(), frozenset({"x"})]))
            for _ in range(draw(st.integers(0, 2))):
                req = draw(SHARES)
                mem = draw(st.sampled_from([0, 2000, 4000]))
                if used + to_milli(req) > 1000 or used_mem + mem > memory:
                    break
                used, used_mem, sid = used + to_milli(req), used_mem + mem, sid + 1
                shares.append(Share(f"s{sid}", req, mem, priority=draw(st.integers(0, 60)), exclusion=excl,
                                    team=draw(st.sampled_from(TEAMS))))
            gpus.append(Gpu(f"n{n}g{j}", j, draw(st.sampled_from(["A", "B"])), memory, shares=tuple(shares)))
        status = draw(st.sampled_from([NodeStatus.READY, NodeStatus.READY, NodeStatus.DRAINING]))
        nodes.append(
            Node(f"n{n}", tuple(gpus), status=status, cpu_milli_free=draw(st.sampled_from([None, 4000])))
        )
    return Snapshot(tuple(nodes))


TEAMS = ["vision", "nlp"]


@st.composite
def requests(draw):
    out = []
    gang = PodGroup("gang", headcount=3, threshold=draw(st.sampled_from([0.5, 1.0])))
    for i in range(draw(st.integers(1, 10))):
        count = draw(st.sampled_from([1, 1, 1, 2]))
        out.append(
            Request(
                f"r{i}",
                gpu_request=1.0 if count > 1 else draw(SHARES),
                gpu_count=count,
                gpu_memory_mib=draw(st.sampled_from([0, 0, 3000, 9000])),
                gpu_model=draw(st.sampled_from([None, "A", "A|B"])),
                priority=draw(st.integers(0, 100)),
                team=draw(st.sampled_from(TEAMS)),
                anti_affinity=draw(st.sampled_from([frozenset(), frozenset({"x"})])),
                exclusion=draw(
                    st.sampled_from([frozenset(), frozenset(), frozenset({"x"}), frozenset({"y"})])
                ),
                group=gang if draw(st.integers(0, 4)) == 0 else None,
                cpu_milli=draw(st.sampled_from([0, 1000, 3000])),
            )
        )
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), pending=requests(), policy=st.sampled_from(POLICIES))
def test_decisions_never_break_the_rules(snap, pending, policy):
    result = schedule(snap, pending, policy)
    note = f"{snap!r}\n{pending!r}\n{result!r}"
    by_id = {r.id: r for r in pending}
    decided = [p.request_id for p in result.placements] + [p.request_id for p in result.preemptions]
    decided += [u.request_id for u in result.unschedulable]
    assert sorted(decided) == sorted(by_id), note

    gpus = {g.uuid: (n, g) for n in snap.nodes for g in n.gpus}
    on_gpu = defaultdict(list)
    priority_of = {}
    team_of = {}
    for n in snap.nodes:
        for g in n.gpus:
            for s in g.shares:
                on_gpu[g.uuid].append(
                    (s.reservation_id, to_milli(s.gpu_request), s.gpu_memory_mib, s.exclusion, s.anti_affinity)
                )
                priority_of[s.reservation_id] = s.priority
                team_of[s.reservation_id] = s.team
    for pre in result.preemptions:
        req = by_id[pre.request_id]
        assert req.priority > 0
        for victim in pre.victims:
            assert priority_of[victim] < req.priority, "never preempts equal or higher priority"
            assert team_of[victim] == req.team or priority_of[victim] == 0, "another team's guaranteed work"
            for uuid in on_gpu:
                on_gpu[uuid] = [s for s in on_gpu[uuid] if s[0] != victim]
    new = [*result.placements, *(p.placement for p in result.preemptions)]
    for p in new:
        req = by_id[p.request_id]
        assert len(p.gpu_uuids) == req.gpu_count
        for uuid in p.gpu_uuids:
            node, gpu = gpus[uuid]
            assert node.name == p.node and node.status == NodeStatus.READY
            assert req.gpu_model is None or gpu.model in req.gpu_model
            for other in on_gpu[uuid]:
                assert not (req.anti_affinity & other[4]), "anti-affinity violated"
            on_gpu[uuid].append((req.id, req.milli, req.gpu_memory_mib, req.exclusion, req.anti_affinity))
    for uuid, shares in on_gpu.items():
        _, gpu = gpus[uuid]
        assert sum(s[1] for s in shares) <= 1000, "GPU compute over-committed"
        assert sum(s[2] for s in shares) <= gpu.memory_mib, "GPU memory over-committed"
        assert len({s[3] for s in shares}) <= 1, "exclusion groups mixed on one GPU"
    gang = [r for r in pending if r.group is not None]
    if gang:
        placed = sum(1 for p in new if p.group == "gang")
        assert placed == 0 or placed >= gang[0].group.min_members, "gang placed partially"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), pending=requests(), policy=st.sampled_from(["tessera", "best-fit"]))
def test_decide_yields_the_decisions_of_schedule_one_at_a_time(snap, pending, policy):
    """`decide` is `schedule` one decision at a time (the portal commits the first ones while the
    rest are computed): the same placements, preemptions and refusals, each request decided once,
    and a pod group's placed members together in one tuple."""
    result = schedule(snap, pending, policy)
    decisions = list(decide(snap, pending, policy))
    placed = [p for d in decisions if isinstance(d, tuple) for p in d]
    assert placed == list(result.placements)
    assert [d for d in decisions if isinstance(d, Preemption)] == list(result.preemptions)
    assert [d for d in decisions if isinstance(d, Unschedulable)] == list(result.unschedulable)
    ids = [p.request_id for p in placed] + [d.request_id for d in decisions if not isinstance(d, tuple)]
    assert sorted(ids) == sorted(r.id for r in pending)
    for d in decisions:
        if isinstance(d, tuple):
            groups = {p.group for p in d}
            assert len(d) == 1 or (len(groups) == 1 and None not in groups), d
    gang = [p for p in placed if p.group == "gang"]
    assert not gang or any(isinstance(d, tuple) and d == tuple(gang) for d in decisions)


def _blank(node: Node) -> Node:
    return replace(node, cpu_milli_free=None, status=NodeStatus.READY,
                   gpus=tuple(replace(g, shares=()) for g in node.gpus))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(), pending=requests(), policy=st.sampled_from(["tessera", "best-fit"]))
def test_a_snapshot_with_its_fleet_layout_decides_exactly_as_without(snap, pending, policy):
    """The portal keeps the fleet laid out between snapshots (Snapshot.layout); the engine's state
    from it, and so every decision and capacity answer, is the one it builds from scratch."""
    blanks = [_blank(n) for n in snap.nodes]
    layout = FleetLayout(blanks)
    # Nodes with nothing on them are the layout's own objects, as the portal passes them.
    nodes = tuple(blank if n == blank else n for n, blank in zip(snap.nodes, blanks, strict=True))
    laid_out = Snapshot(nodes, layout=layout)
    assert layout.fits(laid_out.nodes)
    fresh, reused = ClusterState.from_snapshot(snap), ClusterState.from_snapshot(laid_out)
    for name in ("free", "mem_free", "cpu_free", "node_mem_free", "ready", "version", "valid", "gpu_model"):
        assert (getattr(fresh, name) == getattr(reused, name)).all(), name
    for name in ("labels", "labelled_shares", "placed", "group_nodes", "node_labels", "gpu_uuids", "nvlink"):
        assert getattr(fresh, name) == getattr(reused, name), name
    assert schedule(snap, pending, policy) == schedule(laid_out, pending, policy)
    for request in pending[:3]:
        assert best_gpus(snap, request, 5, policy) == best_gpus(laid_out, request, 5, policy)
    # The layout's own state is never changed by a snapshot started from it.
    assert (layout.empty.free == ClusterState.from_snapshot(Snapshot(tuple(blanks))).free).all()


def test_a_layout_refuses_another_fleet():
    layout = FleetLayout([Node("a", (Gpu("a-0", 0, "A", 8000),)), Node("b", (Gpu("b-0", 0, "A", 8000),))])
    assert not layout.fits((Node("a", (Gpu("a-0", 0, "A", 8000),)),))
    assert not layout.fits((Node("a", (Gpu("a-0", 0, "A", 8000),)), Node("c", (Gpu("c-0", 0, "A", 8000),))))
    assert not layout.fits((Node("a", (Gpu("a-0", 0, "A", 8000),)), Node("b", (Gpu("b-9", 0, "A", 8000),))))
    other = Snapshot((Node("a", (Gpu("a-0", 0, "A", 8000),)),), layout=layout)
    assert ClusterState.from_snapshot(other).node_names == ["a"]  # built from scratch, not from the layout
