from scheduler.core import Request, Share, Snapshot, schedule


def test_guarantee_preempts_the_fewest_lower_priority_shares(node):
    shares = {0: [Share("a", 0.5, priority=0), Share("b", 0.5, priority=0)], 1: [Share("c", 0.9, priority=0)]}
    snap = Snapshot((node("n", gpus=2, shares=shares),))
    result = schedule(snap, [Request("g", gpu_request=0.6, priority=50)])
    [pre] = result.preemptions
    assert pre.victims == ("c",)
    assert pre.placement.gpu_uuids == ("n-g1",)


def test_lowest_priority_victims_first(node):
    shares = {0: [Share("p10", 0.5, priority=10)], 1: [Share("p5", 0.5, priority=5)]}
    snap = Snapshot((node("n", gpus=2, shares=shares),))
    # Each GPU has 0.5 free; 0.8 needs one victim; the priority-5 one goes.
    [pre] = schedule(snap, [Request("g", gpu_request=0.8, priority=50)]).preemptions
    assert pre.victims == ("p5",)


def test_never_preempts_equal_or_higher_priority(node):
    shares = {0: [Share("same", 1.0, priority=50)]}
    snap = Snapshot((node("n", shares=shares),))
    result = schedule(snap, [Request("g", gpu_request=0.5, priority=50)])
    assert result.preemptions == () and result.unschedulable[0].codes[-1] == "no_fit"


def test_opportunistic_requests_do_not_preempt(node):
    snap = Snapshot((node("n", shares={0: [Share("x", 1.0, priority=0)]}),))
    result = schedule(snap, [Request("o", gpu_request=0.5, priority=0)])
    assert result.preemptions == ()


def test_whole_gpu_preemption_evicts_everything_on_the_gpu(node):
    shares = {
        0: [Share("a", 0.3, priority=0), Share("b", 0.3, priority=0)],
        1: [Share("c", 0.3, priority=60)],
    }
    snap = Snapshot((node("n", gpus=2, shares=shares),))
    [pre] = schedule(snap, [Request("w", gpu_request=1.0, priority=50)]).preemptions
    assert set(pre.victims) == {"a", "b"} and pre.placement.gpu_uuids == ("n-g0",)


def test_preemption_can_be_turned_off(node):
    snap = Snapshot((node("n", shares={0: [Share("x", 1.0, priority=0)]}),))
    result = schedule(snap, [Request("g", gpu_request=0.5, priority=90)], preemption=False)
    assert result.preemptions == () and len(result.unschedulable) == 1


def test_across_teams_only_opportunistic_work_is_preempted(node):
    shares = {0: [Share("nlp-guaranteed", 1.0, priority=10, team="nlp")],
              1: [Share("nlp-opportunistic", 1.0, priority=0, team="nlp")]}
    snap = Snapshot((node("n", gpus=2, shares=shares),))
    [pre] = schedule(snap, [Request("vision-urgent", gpu_request=0.5, priority=100, team="vision")]).preemptions
    assert pre.victims == ("nlp-opportunistic",)


def test_another_teams_guaranteed_work_is_never_preempted_by_priority(node):
    snap = Snapshot((node("n", shares={0: [Share("nlp-low", 1.0, priority=1, team="nlp")]}),))
    result = schedule(snap, [Request("vision-urgent", gpu_request=0.5, priority=100, team="vision")])
    assert result.preemptions == () and len(result.unschedulable) == 1


def test_within_a_team_priority_decides(node):
    snap = Snapshot((node("n", shares={0: [Share("vision-low", 1.0, priority=10, team="vision")]}),))
    [pre] = schedule(snap, [Request("vision-high", gpu_request=0.5, priority=60, team="vision")]).preemptions
    assert pre.victims == ("vision-low",)


def test_whole_gpu_request_never_evicts_another_teams_guaranteed_neighbour(node):
    shares = {0: [Share("vision-low", 0.3, priority=5, team="vision"), Share("nlp", 0.3, priority=5, team="nlp")]}
    snap = Snapshot((node("n", shares=shares),))
    result = schedule(snap, [Request("vision-whole", gpu_request=1.0, priority=90, team="vision")])
    assert result.preemptions == ()
