from scheduler.core import PodGroup, Request, Share, Snapshot, schedule


def members(n, group, **kw):
    return [Request(f"{group.name}-{i}", group=group, **kw) for i in range(n)]


def test_gang_places_all_members_together(node):
    g = PodGroup("train", headcount=3)
    snap = Snapshot((node("a", gpus=2), node("b", gpus=2)))
    result = schedule(snap, members(3, g, gpu_request=1.0))
    assert len(result.placements) == 3
    assert all(p.group == "train" for p in result.placements)


def test_gang_is_all_or_nothing(node):
    g = PodGroup("train", headcount=3)
    snap = Snapshot((node("a", gpus=2),))
    result = schedule(snap, [*members(3, g, gpu_request=1.0), Request("solo", gpu_request=0.5)])
    assert [p.request_id for p in result.placements] == [
        "solo"
    ]  # the gang's partial reservation was rolled back
    gang = [u for u in result.unschedulable if u.request_id.startswith("train")]
    assert len(gang) == 3 and all(u.codes[0] == "gang_incomplete" for u in gang)


def test_threshold_allows_a_partial_gang(node):
    g = PodGroup("train", headcount=4, threshold=0.5)
    snap = Snapshot((node("a", gpus=2),))
    result = schedule(snap, members(4, g, gpu_request=1.0))
    assert len(result.placements) == 2


def test_running_members_count_towards_the_threshold(node):
    g = PodGroup("train", headcount=2)
    snap = Snapshot((node("a", gpus=2, shares={0: [Share("train-0", 1.0, group="train")]}),))
    result = schedule(snap, [Request("train-1", group=g)])
    assert "train-1" in {p.request_id for p in result.placements}


def test_gang_members_stay_on_one_node_when_they_can(node):
    g = PodGroup("train", headcount=4)
    snap = Snapshot(tuple(node(n, gpus=4) for n in ("a", "b", "c")))
    result = schedule(snap, members(4, g, gpu_request=0.5), "spread")
    assert len({p.node for p in result.placements}) == 1


def test_gang_members_stay_in_one_rack_when_a_node_is_too_small(node):
    g = PodGroup("train", headcount=3)
    nodes = (
        node("a1", gpus=2, labels={"rack": "r1"}),
        node("b1", gpus=2, labels={"rack": "r2"}),
        node("a2", gpus=2, labels={"rack": "r1"}),
    )
    result = schedule(Snapshot(nodes), members(3, g, gpu_request=1.0), "spread")
    racks = {dict(n.labels)["rack"] for n in nodes if n.name in {p.node for p in result.placements}}
    assert racks == {"r1"}
