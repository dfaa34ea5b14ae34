from scheduler.core import Request, Share, Snapshot, schedule


def test_affinity_joins_the_gpu_that_holds_the_label(node):
    snap = Snapshot((node("a", gpus=2), node("b", shares={0: [Share("s", 0.3, affinity="team-x")]})))
    (p,) = schedule(snap, [Request("r", gpu_request=0.3, affinity="team-x")], "spread").placements
    assert p is not None and p.gpu_uuids == ("b-g0",)


def test_affinity_waits_when_its_gpu_is_full(node):
    snap = Snapshot((node("a", gpus=2), node("b", shares={0: [Share("s", 0.9, affinity="team-x")]})))
    [refused] = schedule(snap, [Request("r", gpu_request=0.3, affinity="team-x")]).unschedulable
    assert "affinity" in refused.codes


def test_anti_affinity_spreads_over_gpus(node):
    snap = Snapshot((node("a", gpus=2),))
    reqs = [Request(f"r{i}", gpu_request=0.2, anti_affinity="replica") for i in range(3)]
    result = schedule(snap, reqs, "packing")
    gpus = [p.gpu_uuids[0] for p in result.placements]
    assert len(gpus) == 2 and len(set(gpus)) == 2
    assert "anti_affinity" in result.unschedulable[0].codes


def test_exclusion_label_takes_only_its_own_gpus(node):
    snap = Snapshot((node("a", gpus=2, shares={0: [Share("s", 0.2, exclusion="secret")]}),))
    result = schedule(
        snap, [Request("plain", gpu_request=0.2), Request("mine", gpu_request=0.2, exclusion="secret")]
    )
    placed = {p.request_id: p.gpu_uuids for p in result.placements}
    assert placed["plain"] == ("a-g1",)
    assert placed["mine"] == ("a-g0",)


def test_exclusion_never_mixes_with_unlabelled_shares(node):
    snap = Snapshot((node("a", shares={0: [Share("s", 0.2)]}),))
    [refused] = schedule(snap, [Request("x", gpu_request=0.2, exclusion="secret")]).unschedulable
    assert refused.codes[0] == "exclusion"
