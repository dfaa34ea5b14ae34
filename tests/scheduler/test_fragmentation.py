"""The closed-form fragmentation and the cached FGD scores agree with the direct definitions."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import ClusterState, Request, TypicalPod, typical_pods
from scheduler.core.filters import feasible, feasible_by_filters, nodes_with_room
from scheduler.core.fragmentation import FgdScorer, Fragmentation

TYPICAL = [
    TypicalPod(4000, 500, 1, None, 0.3),
    TypicalPod(8000, 250, 1, frozenset({"A"}), 0.2),
    TypicalPod(12000, 1000, 1, None, 0.2),
    TypicalPod(30000, 1000, 2, None, 0.1),
    TypicalPod(2000, 0, 0, None, 0.2),  # CPU-only pods count all idle GPU as fragment
]


def direct_frag(free_row, cpu, model, typical):
    """The reference simulator's definition, pod by pod."""
    total = sum(free_row)
    frag = 0.0
    for t in typical:
        fits_model = t.models is None or model in t.models
        if t.milli == 0 or not fits_model:
            frag += t.freq * total
            continue
        enough = sum(1 for f in free_row if f >= t.milli) >= t.count
        if enough and cpu >= t.cpu_milli:
            frag += t.freq * sum(f for f in free_row if f < t.milli)
        else:
            frag += t.freq * total
    return frag


def random_state(draw_free, cpus, models):
    widths = [len(r) for r in draw_free]
    state = ClusterState(
        node_names=[f"n{i}" for i in range(len(draw_free))],
        gpu_models=[[m] * w for m, w in zip(models, widths, strict=True)],
        gpu_memory_mib=[[16000] * w for w in widths],
        cpu_milli_free=cpus,
    )
    for i, row in enumerate(draw_free):
        state.free[i, : len(row)] = row
    return state


nodes_st = st.lists(
    st.tuples(
        st.lists(st.sampled_from([0, 50, 250, 500, 750, 1000]), min_size=1, max_size=4),
        st.sampled_from([0, 3000, 9000, 40000]),
        st.sampled_from(["A", "B"]),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(nodes=nodes_st)
def test_closed_form_matches_the_definition(nodes):
    state = random_state([n[0] for n in nodes], [n[1] for n in nodes], [n[2] for n in nodes])
    frag = Fragmentation(state, TYPICAL)
    frag.refresh()
    for i, (row, cpu, model) in enumerate(nodes):
        assert frag.frag[i] == np.float64(direct_frag(row, cpu, model, TYPICAL)) or np.isclose(
            frag.frag[i], direct_frag(row, cpu, model, TYPICAL)
        )


@settings(max_examples=40, deadline=None)
@given(nodes=nodes_st, milli=st.sampled_from([100, 250, 500, 1000]), count=st.sampled_from([1, 2]))
def test_placement_delta_matches_recomputing_the_node(nodes, milli, count):
    state = random_state([n[0] for n in nodes], [n[1] for n in nodes], [n[2] for n in nodes])
    if count > 1:
        milli = 1000
    scorer = FgdScorer(state, TYPICAL)
    scorer.frag.refresh()
    req = Request("r", gpu_request=milli / 1000, gpu_count=count, cpu_milli=1000)
    idx = np.arange(len(nodes))
    deltas = scorer.deltas(req, idx)
    for i, (row, cpu, model) in enumerate(nodes):
        before = direct_frag(row, cpu, model, TYPICAL)
        if count == 1 and milli < 1000:
            for j, f in enumerate(row):
                if f >= milli:
                    after_row = list(row)
                    after_row[j] -= milli
                    assert np.isclose(
                        deltas[i, j], before - direct_frag(after_row, cpu - 1000, model, TYPICAL)
                    )
        elif sum(1 for f in row if f == 1000) >= count:
            after_row = sorted(row)
            taken = 0
            for j, f in enumerate(after_row):
                if f == 1000 and taken < count:
                    after_row[j], taken = 0, taken + 1
            assert np.isclose(deltas[i], before - direct_frag(after_row, cpu - 1000, model, TYPICAL))


def test_cached_scores_follow_every_change():
    rng = np.random.default_rng(7)
    state = random_state([[1000] * 4 for _ in range(12)], [64000] * 12, ["A"] * 12)
    scorer = FgdScorer(state, TYPICAL)
    for k in range(60):
        req = Request(f"r{k}", gpu_request=float(rng.choice([0.25, 0.5, 1.0])), cpu_milli=2000)
        ok = feasible(state, req)
        room = nodes_with_room(ok, req)
        if not room.any():
            break
        cached, _ = scorer.score(state, req, ok, room)
        fresh, _ = FgdScorer(state, TYPICAL).score(state, req, ok, room)
        assert np.array_equal(np.where(room, cached, 0), np.where(room, fresh, 0))
        i = int(rng.choice(np.flatnonzero(room)))
        j = int(np.flatnonzero(ok[i])[0])
        state.reserve(req, i, (j,))


@settings(max_examples=60, deadline=None)
@given(nodes=nodes_st, milli=st.sampled_from([100, 500, 1000]), cpu=st.sampled_from([0, 5000]),
       memory=st.sampled_from([0, 1000, 8000, 16000]), used=st.lists(st.sampled_from([0, 4000, 12000]), min_size=24,
                                                                    max_size=24))
def test_fast_feasibility_equals_the_filter_chain(nodes, milli, cpu, memory, used):
    state = random_state([n[0] for n in nodes], [n[1] for n in nodes], [n[2] for n in nodes])
    state.mem_free -= np.array(used[: state.mem_free.size]).reshape(state.mem_free.shape)  # some GPU memory taken
    for model in (None, "A"):
        req = Request("r", gpu_request=milli / 1000, gpu_model=model, cpu_milli=cpu, gpu_memory_mib=memory)
        assert np.array_equal(feasible(state, req), feasible_by_filters(state, req))


def test_typical_pods_cover_the_requested_share_most_frequent_first():
    reqs = [Request(f"a{i}", gpu_request=0.5) for i in range(6)]
    reqs += [Request(f"b{i}", gpu_request=0.25) for i in range(3)]
    reqs += [Request("c", gpu_request=1.0)]
    typical = typical_pods(reqs, coverage=0.85)
    assert [t.milli for t in typical] == [500, 250]
    assert np.isclose(sum(t.freq for t in typical), 1.0)
    assert typical[0].cpu_milli == 100  # no CPU request counts as 100m, as kube-scheduler
