"""Filters and placement: what a user of the portal would see a request get (or not)."""

from scheduler.core import Node, NodeStatus, Request, Share, Snapshot, best_gpus, feasible_gpus, schedule


def placed(result, rid):
    p = next((p for p in result.placements if p.request_id == rid), None)
    assert p is not None, f"{rid} was not placed: {result.unschedulable}"
    return p


def test_fractional_requests_share_a_gpu_up_to_one(node):
    snap = Snapshot((node("n1", gpus=1),))
    reqs = [Request(f"r{i}", gpu_request=0.3) for i in range(4)]
    result = schedule(snap, reqs, "best-fit")
    assert len(result.placements) == 3
    [refused] = result.unschedulable
    assert "compute" in refused.codes and "no_fit" in refused.codes


def test_limit_above_request_is_not_reserved(node):
    snap = Snapshot((node("n1", gpus=1),))
    reqs = [Request("a", gpu_request=0.5, gpu_limit=1.0), Request("b", gpu_request=0.5, gpu_limit=1.0)]
    result = schedule(snap, reqs)
    assert {p.request_id for p in result.placements} == {"a", "b"}


def test_gpu_memory_is_a_hard_limit(node):
    snap = Snapshot((node("n1", gpus=1, memory_mib=16_000),))
    reqs = [
        Request("a", gpu_request=0.2, gpu_memory_mib=10_000),
        Request("b", gpu_request=0.2, gpu_memory_mib=10_000),
    ]
    result = schedule(snap, reqs)
    assert [p.request_id for p in result.placements] == ["a"]
    assert result.unschedulable[0].codes[0] == "memory"


def test_model_filter_accepts_a_set_of_models(node):
    snap = Snapshot((node("t4", model="T4"), node("v100", model="V100M32")))
    result = schedule(snap, [Request("r", gpu_model="V100M16|V100M32")])
    assert placed(result, "r").node == "v100"
    refused = schedule(snap, [Request("r", gpu_model="A100")]).unschedulable[0]
    assert refused.codes[0] == "model"
    assert refused.reasons[0].count == 2


def test_whole_gpu_requests_take_fully_free_gpus_of_one_node(node):
    busy = {0: [Share("s", 0.1)]}
    snap = Snapshot((node("a", gpus=2, shares=busy), node("b", gpus=2)))
    p = placed(schedule(snap, [Request("r", gpu_count=2)]), "r")
    assert p.node == "b" and p.gpu_indexes == (0, 1)


def test_multi_gpu_prefers_nvlink_then_numa(gpu):
    gpus = (
        gpu("g0", 0, nvlink_peers={1}, numa_node=0),
        gpu("g1", 1, nvlink_peers={0}, numa_node=0),
        gpu("g2", 2, nvlink_peers={3}, numa_node=1),
        gpu("g3", 3, nvlink_peers={2}, numa_node=1),
    )
    busy_g0 = (gpu("g0", 0, shares=[Share("s", 0.2)], nvlink_peers={1}, numa_node=0), *gpus[1:])
    snap = Snapshot((Node("n", busy_g0),))
    p = placed(schedule(snap, [Request("r", gpu_count=2)]), "r")
    assert p.gpu_indexes == (2, 3)  # the linked pair, not the lowest free indexes (1, 2)
    numa_only = tuple(gpu(f"h{i}", i, numa_node=i // 2) for i in range(4))
    busy_h0 = (gpu("h0", 0, shares=[Share("s", 0.2)], numa_node=0), *numa_only[1:])
    p = placed(schedule(Snapshot((Node("m", busy_h0),)), [Request("r", gpu_count=2)]), "r")
    assert p.gpu_indexes == (2, 3)


def test_draining_and_lost_nodes_take_nothing_new(node):
    snap = Snapshot((node("d", status=NodeStatus.DRAINING), node("l", status=NodeStatus.LOST)))
    refused = schedule(snap, [Request("r", gpu_request=0.1)]).unschedulable[0]
    assert refused.codes[0] == "node_not_ready"
    assert refused.reasons[0].count == 2


def test_node_cpu_and_memory_are_filters(node):
    snap = Snapshot(
        (node("small", cpu_milli_free=2000, memory_mib_free=4096), node("big", cpu_milli_free=64000))
    )
    p = placed(schedule(snap, [Request("r", gpu_request=0.5, cpu_milli=4000, memory_mib=8192)]), "r")
    assert p.node == "big"
    refused = schedule(Snapshot((node("small", cpu_milli_free=2000),)), [Request("r", cpu_milli=4000)])
    assert refused.unschedulable[0].codes[0] == "node_cpu"


def test_priority_orders_the_queue_within_a_cycle(node):
    snap = Snapshot((node("n1"),))
    reqs = [Request("low", gpu_request=0.6, priority=0), Request("high", gpu_request=0.6, priority=50)]
    result = schedule(snap, reqs, preemption=False)
    assert [p.request_id for p in result.placements] == ["high"]


def test_unschedulable_reasons_are_data(node):
    snap = Snapshot((node("n1", model="T4"),))
    [refused] = schedule(snap, [Request("r", gpu_model="A100")]).unschedulable
    d = refused.reasons[0].as_dict()
    assert d["code"] == "model" and "A100" in d["message"] and d["count"] == 1


def test_capacity_lists_candidates_best_first_and_reasons(node):
    half = {0: [Share("s", 0.5)]}
    snap = Snapshot((node("a", gpus=2, shares=half), node("b", model="T4")))
    cands, reasons = feasible_gpus(snap, Request("q", gpu_request=0.6, gpu_model="A100"), policy="best-fit")
    assert [c.gpu_uuid for c in cands] == ["a-g1"]
    assert cands[0].free_share == 1.0
    assert {r.code for r in reasons} == {"model", "compute"}


def test_the_best_few_candidates_are_the_head_of_the_whole_list_and_all_are_counted(node):
    nodes = tuple(node(f"n{i}", gpus=4, shares={j: [Share(f"s{i}{j}", 0.1 * ((i + j) % 5) + 0.05)] for j in range(4)})
                  for i in range(6))
    request = Request("q", gpu_request=0.5)
    everything, _ = feasible_gpus(Snapshot(nodes), request)
    best, count, _ = best_gpus(Snapshot(nodes), request, 5)
    assert best == everything[:5] and count == len(everything) > 5
    assert best_gpus(Snapshot(nodes), request, None)[0] == everything


def test_capacity_of_a_full_cluster_says_why(node):
    snap = Snapshot((node("a", shares={0: [Share("s", 1.0)]}),))
    cands, reasons = feasible_gpus(snap, Request("q", gpu_request=0.1))
    assert cands == []
    assert [r.code for r in reasons] == ["compute", "no_fit"]


def test_every_policy_places_a_simple_request(node):
    from scheduler.core import POLICIES

    snap = Snapshot((node("a", gpus=2), node("b", gpus=2)))
    for policy in POLICIES:
        result = schedule(snap, [Request("r", gpu_request=0.5), Request("w", gpu_count=2)], policy)
        assert {p.request_id for p in result.placements} == {"r", "w"}, policy


def test_a_request_that_already_runs_is_refused_as_invalid(node):
    snap = Snapshot((node("a", shares={0: [Share("r", 0.5)]}),))
    [refused] = schedule(snap, [Request("r", gpu_request=0.2)]).unschedulable
    assert refused.codes == ("invalid",)
