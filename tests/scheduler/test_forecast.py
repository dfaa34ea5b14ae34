"""Estimated starts as a waiting user sees them: the end that really frees a GPU they can use."""

from __future__ import annotations

import random

import pytest

from scheduler.core import NodeStatus, PodGroup, Request, Share, Snapshot, TeamUsage
from scheduler.core.engine import choose, make_scorer
from scheduler.core.forecast import Estimate, QueueOrder, RunLengths, estimate_starts
from scheduler.core.forecast.preemption import preempt_on
from scheduler.core.fragmentation import typical_pods
from scheduler.core.preemption import find_preemption
from scheduler.core.state import ClusterState

from .conftest import make_node

NOW = 1000.0


def busy(rid, request=1.0, team="", **kw):
    return Share(rid, request, team=team, **kw)


def test_a_v100_request_on_a_drained_v100_node_gets_no_estimate_and_says_why():
    snap = Snapshot((
        make_node("v1", model="V100", status=NodeStatus.DRAINING),
        make_node("a1", model="A100", shares={0: [busy("a-job")]}),
    ))
    out = estimate_starts(snap, [Request("mine", gpu_model="V100")], {"a-job": NOW + 600}, now=NOW)
    assert out["mine"].start is None
    assert out["mine"].code == "no_ready_gpu"
    assert "V100" in out["mine"].reason and "draining or lost" in out["mine"].reason


def test_a_request_for_a_model_the_cluster_lacks_says_so():
    snap = Snapshot((make_node("a1", model="A100", shares={0: [busy("a-job")]}),))
    out = estimate_starts(snap, [Request("mine", gpu_model="H100")], {"a-job": NOW + 60}, now=NOW)
    assert out["mine"] == Estimate(None, "no estimate: the cluster has no GPU of model H100", "no_ready_gpu")


def test_a_t4_request_waits_for_the_t4_reservation_not_an_earlier_a100_one():
    snap = Snapshot((
        make_node("a1", model="A100", shares={0: [busy("a-job")]}),
        make_node("t1", model="T4", shares={0: [busy("t-job")]}),
    ))
    ends = {"a-job": NOW + 600, "t-job": NOW + 3600}
    out = estimate_starts(snap, [Request("mine", gpu_model="T4")], ends, now=NOW)
    assert out["mine"].start == NOW + 3600
    assert out["mine"].code == "after_ends" and "t-job" in out["mine"].reason and "t1" in out["mine"].reason


def test_a_request_that_fits_now_starts_now():
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("a-job")]}),))
    out = estimate_starts(snap, [Request("mine")], {}, now=NOW)
    assert out["mine"] == Estimate(NOW, "it fits now", "now")


def test_a_request_behind_another_gets_the_later_end():
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("early")], 1: [busy("late")]}),))
    ends = {"early": NOW + 100, "late": NOW + 900}
    out = estimate_starts(snap, [Request("first"), Request("second")], ends, now=NOW)
    assert out["first"].start == NOW + 100
    assert out["second"].start == NOW + 900


def test_an_exclusion_labelled_request_waits_for_a_gpu_its_group_may_use():
    # g0 holds the other group's share and frees first; g1 holds a share of the request's group.
    snap = Snapshot((make_node("a1", gpus=2, shares={
        0: [busy("other", 0.5, exclusion="blue"), busy("other-2", 0.5, exclusion="blue")],
        1: [busy("ours", 0.5, exclusion="red"), busy("ours-2", 0.5, exclusion="red")],
    }),))
    ends = {"other": NOW + 100, "ours": NOW + 700, "other-2": NOW + 5000}
    out = estimate_starts(snap, [Request("mine", gpu_request=0.5, exclusion="red")], ends, now=NOW)
    assert out["mine"].start == NOW + 700 and "ours" in out["mine"].reason


def test_a_small_request_passes_a_blocked_large_one():
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("half", 0.5)], 1: [busy("whole")]}),))
    ends = {"half": NOW + 100, "whole": NOW + 2000}
    queue = [Request("pair", gpu_count=2), Request("small", gpu_request=0.5)]
    out = estimate_starts(snap, queue, ends, now=NOW)
    assert out["small"].start == NOW  # half a GPU is free now
    # The pair needs both GPUs whole: the half freed at +100 is taken by nothing, the whole one ends at +2000,
    # but "small" holds half of g0 from now on and has no known duration.
    assert out["pair"].start is None and out["pair"].code == "unknown_ends"
    assert "expected to start before it" in out["pair"].reason


def test_a_small_request_starts_on_an_early_end_while_the_large_one_ahead_waits():
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("x")], 1: [busy("y")]}),))
    ends = {"x": NOW + 100, "y": NOW + 800}
    queue = [Request("pair", gpu_count=2), Request("small", gpu_request=0.5)]
    out = estimate_starts(snap, queue, ends, now=NOW, durations={"small": 300})
    assert out["small"].start == NOW + 100
    assert out["pair"].start == NOW + 800  # "small" is done by +400, both GPUs are whole at +800


def test_unknown_ends_give_no_estimate_with_the_reason():
    snap = Snapshot((make_node("a1", shares={0: [busy("forever")]}),))
    out = estimate_starts(snap, [Request("mine")], {}, now=NOW)
    assert out["mine"].start is None
    assert out["mine"].code == "unknown_ends"
    assert "held by reservations without a known end" in out["mine"].reason


class TeamGpus:
    """A gate: each team may hold at most `cap` GPUs of any model at once."""

    def __init__(self, cap, holders):
        self.cap, self.holders, self.held = cap, dict(holders), {}
        for team in self.holders.values():
            self.held[team] = self.held.get(team, 0) + 1

    def allowed(self, req):
        return None if self.held.get(req.team, 0) + req.gpu_count <= self.cap else frozenset()

    def charge(self, req, model):
        self.holders[req.id] = req.team
        self.held[req.team] = self.held.get(req.team, 0) + req.gpu_count

    def refund(self, reservation_id):
        team = self.holders.pop(reservation_id, None)
        if team is not None:
            self.held[team] -= 1


def test_the_gate_holds_a_request_until_its_own_teams_reservation_ends():
    snap = Snapshot((make_node("a1", gpus=3, shares={0: [busy("vision-run", team="vision")],
                                                      1: [busy("nlp-run", team="nlp")]}),))
    ends = {"nlp-run": NOW + 100, "vision-run": NOW + 900}
    gate = TeamGpus(1, {"vision-run": "vision", "nlp-run": "nlp"})
    out = estimate_starts(snap, [Request("mine", team="vision")], ends, now=NOW, gate=gate)
    assert out["mine"].start == NOW + 900  # a GPU is free now, and another at +100: not its quota


def test_the_gate_that_never_allows_says_quota():
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("vision-run", team="vision")]}),))
    gate = TeamGpus(1, {"vision-run": "vision"})
    out = estimate_starts(snap, [Request("mine", team="vision")], {}, now=NOW, gate=gate)
    assert out["mine"].start is None and out["mine"].code == "quota" and "quota" in out["mine"].reason


class OnlyModel:
    """A gate that lets every request use one GPU model only (its team's quota is on that model)."""

    def __init__(self, model):
        self.model = frozenset([model])

    def allowed(self, req):
        return self.model

    def charge(self, req, model):
        assert model in self.model

    def refund(self, reservation_id):
        pass


def test_a_request_of_any_model_waits_for_the_model_its_quota_allows():
    snap = Snapshot((
        make_node("a1", model="A100", shares={0: [busy("a-job")]}),
        make_node("t1", model="T4", shares={0: [busy("t-job")]}),
    ))
    ends = {"a-job": NOW + 100, "t-job": NOW + 900}
    out = estimate_starts(snap, [Request("mine")], ends, now=NOW, gate=OnlyModel("T4"))
    assert out["mine"].start == NOW + 900 and "t1" in out["mine"].reason


def test_durations_of_requests_placed_in_the_forecast_free_their_room():
    snap = Snapshot((make_node("a1", shares={0: [busy("run")]}),))
    queue = [Request("first"), Request("second")]
    out = estimate_starts(snap, queue, {"run": NOW + 100}, now=NOW, durations={"first": 500})
    assert out["first"].start == NOW + 100
    assert out["second"].start == NOW + 600 and "first" in out["second"].reason
    without = estimate_starts(snap, queue, {"run": NOW + 100}, now=NOW)
    assert without["second"].start is None and "expected to start before it" in without["second"].reason


def test_following_the_order_a_team_that_got_a_gpu_falls_behind_one_that_did_not():
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("x", team="ops")], 1: [busy("y", team="ops")]}),),
                    teams={"vision": TeamUsage(2, 0), "nlp": TeamUsage(2, 0)})
    queue = [Request("v1", team="vision", created_at=0), Request("v2", team="vision", created_at=1),
             Request("n1", team="nlp", created_at=2)]
    ends = {"x": NOW + 100, "y": NOW + 200}
    fixed = estimate_starts(snap, queue, ends, now=NOW)
    assert (fixed["v1"].start, fixed["v2"].start, fixed["n1"].start) == (NOW + 100, NOW + 200, None)
    moving = estimate_starts(snap, queue, ends, now=NOW, order=QueueOrder(snap))
    assert (moving["v1"].start, moving["n1"].start, moving["v2"].start) == (NOW + 100, NOW + 200, None)


def test_a_guarantee_request_evicts_opportunistic_work_once_the_rest_of_the_gpu_ends():
    snap = Snapshot((make_node("a1", shares={0: [busy("guaranteed", 0.5, team="nlp", priority=1),
                                                  busy("spare-time", 0.5, team="ops", priority=0)]}),))
    out = estimate_starts(snap, [Request("mine", team="vision", priority=2)], {"guaranteed": NOW + 300}, now=NOW)
    assert out["mine"].start == NOW + 300
    assert "preempting spare-time" in out["mine"].reason
    low = estimate_starts(snap, [Request("low", team="vision", priority=0)], {"guaranteed": NOW + 300}, now=NOW)
    assert low["low"].start is None and low["low"].code == "unknown_ends"


def test_another_teams_guaranteed_work_is_never_evicted_in_the_forecast():
    snap = Snapshot((make_node("a1", shares={0: [busy("theirs", 1.0, team="nlp", priority=1)]}),))
    out = estimate_starts(snap, [Request("mine", team="vision", priority=50)], {}, now=NOW)
    assert out["mine"].start is None and out["mine"].code == "unknown_ends"


def test_an_end_already_past_counts_as_now():
    snap = Snapshot((make_node("a1", shares={0: [busy("late")]}),))
    out = estimate_starts(snap, [Request("mine")], {"late": NOW - 50}, now=NOW)
    assert out["mine"].start == NOW


def test_a_pod_group_starts_together_when_enough_room_is_free():
    g = PodGroup("train", headcount=2)
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("x")], 1: [busy("y")]}),))
    queue = [Request("train-0", group=g), Request("train-1", group=g)]
    out = estimate_starts(snap, queue, {"x": NOW + 100, "y": NOW + 400}, now=NOW)
    assert out["train-0"].start == out["train-1"].start == NOW + 400


def test_a_pod_group_without_room_in_the_known_ends_says_so():
    g = PodGroup("train", headcount=2)
    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("x")], 1: [busy("y")]}),))
    queue = [Request("train-0", group=g), Request("train-1", group=g)]
    out = estimate_starts(snap, queue, {"x": NOW + 100}, now=NOW)
    assert out["train-0"].start is None and out["train-0"].code == "pod_group"


def test_requests_beyond_the_limit_say_how_many_wait_ahead():
    snap = Snapshot((make_node("a1", shares={0: [busy("run")]}),))
    queue = [Request(f"r{i}") for i in range(5)]
    out = estimate_starts(snap, queue, {"run": NOW + 10}, now=NOW, limit=2)
    assert out["r0"].start == NOW + 10
    assert out["r4"].start is None and out["r4"].code == "behind" and "more than 2" in out["r4"].reason


def test_the_event_budget_is_named():
    snap = Snapshot((make_node("a1", gpus=3, shares={0: [busy("x")], 1: [busy("y")], 2: [busy("z")]}),))
    out = estimate_starts(snap, [Request("big", gpu_count=3)], {"x": NOW + 1, "y": NOW + 2, "z": NOW + 3},
                          now=NOW, max_events=2)
    assert out["big"].start is None and out["big"].code == "event_budget"


# ---- the shortcuts give the answers of a plain walk that retries everything after every end -------

def plain_walk(snap, queue, ends, now, durations, policy, typical):
    state = ClusterState.from_snapshot(snap)
    scorer = make_scorer(policy, state, typical)
    events = sorted((max(t, now), rid) for rid, t in ends.items())
    waiting, starts = list(queue), {}

    def admit(t):
        nonlocal waiting
        left = []
        for req in waiting:
            choice = choose(state, req, scorer)
            if choice is None:
                left.append(req)
                continue
            state.reserve(req, choice.node, choice.slots)
            starts[req.id] = t
            if req.id in durations:
                events.append((t + durations[req.id], req.id))
                events.sort()
        waiting = left

    admit(now)
    while events and waiting:
        t = events[0][0]
        while events and events[0][0] == t:
            state.release(events.pop(0)[1])
        admit(t)
    return starts


@pytest.mark.parametrize("seed", range(12))
def test_the_forecast_matches_a_plain_walk(seed):
    rng = random.Random(seed)
    models = ["A100", "T4", "V100"]
    nodes, ends, k = [], {}, 0
    for i in range(8):
        gpus, shares = rng.choice([1, 2, 4]), {}
        for j in range(gpus):
            used = 0.0
            while used < 0.99 and rng.random() < 0.8:
                size = rng.choice([0.25, 0.5, 1.0])
                if used + size > 1.0:
                    break
                rid = f"s{k}"
                k += 1
                shares.setdefault(j, []).append(busy(rid, size, exclusion=rng.choice(["", "", "", "red"])))
                used += size
                if rng.random() < 0.7:
                    ends[rid] = NOW + rng.randrange(0, 5000, 50)
        status = NodeStatus.DRAINING if rng.random() < 0.1 else NodeStatus.READY
        nodes.append(make_node(f"n{i}", gpus=gpus, model=rng.choice(models), shares=shares, status=status,
                               cpu_milli_free=rng.choice([None, 16000, 4000])))
    queue, durations = [], {}
    for q in range(30):
        count = rng.choice([1, 1, 1, 2])
        req = Request(f"q{q}", gpu_request=1.0 if count > 1 else rng.choice([0.25, 0.5, 1.0]), gpu_count=count,
                      gpu_model=rng.choice([None, *models]), exclusion=rng.choice(["", "", "red"]),
                      cpu_milli=rng.choice([0, 1000, 6000]), affinity=rng.choice(["", "", "", "red"]))
        queue.append(req)
        if rng.random() < 0.5:
            durations[req.id] = rng.randrange(100, 3000, 100)
    snap = Snapshot(tuple(nodes))
    policy = rng.choice(["tessera", "best-fit"])
    typical = typical_pods(queue)
    out = estimate_starts(snap, queue, ends, now=NOW, durations=durations, policy=policy, typical=typical)
    expected = plain_walk(snap, queue, ends, NOW, durations, policy, typical)
    assert {rid: e.start for rid, e in out.items() if e.start is not None} == expected
    assert set(out) == {r.id for r in queue}


# ---- likely ends of reservations with an expiry ---------------------------------------------------

def test_run_lengths_turn_an_expiry_into_the_likely_end():
    lengths = RunLengths(min_samples=5)
    assert lengths.end(0, 3600, now=100) == 3600  # nothing learnt: its expiry
    for used in (900, 1800, 1800, 2700, 3600):
        lengths.observe(used, 3600)
    assert lengths.end(0, 3600, now=100) == 1800  # the median of the past ones
    assert lengths.end(0, 3600, now=2000) == 2700  # it outlived half of them: the median of the rest
    assert lengths.end(0, 3600, now=3500) == 3600
    assert lengths.end(0, 3600, now=4000) == 4000  # past its expiry and still there: any moment
    assert lengths.run(7200) == 3600


@pytest.mark.parametrize("seed", range(10))
def test_preemption_on_all_nodes_finds_what_the_cycle_finds(seed):
    rng = random.Random(seed)
    nodes = []
    for i in range(6):
        gpus, shares = rng.choice([1, 2, 4]), {}
        for j in range(gpus):
            used = 0.0
            while used < 0.99:
                size = rng.choice([0.25, 0.5, 1.0])
                if used + size > 1.0:
                    break
                shares.setdefault(j, []).append(busy(f"s{i}-{j}-{used}", size, team=rng.choice(["a", "b"]),
                                                     priority=rng.choice([0, 0, 1, 3]),
                                                     exclusion=rng.choice(["", "", "red"])))
                used += size
        nodes.append(make_node(f"n{i}", gpus=gpus, model=rng.choice(["A100", "T4"]), shares=shares))
    snap = Snapshot(tuple(nodes))
    for k in range(10):
        count = rng.choice([1, 1, 2])
        req = Request(f"q{k}", team=rng.choice(["a", "b"]), priority=rng.choice([1, 2, 5]), gpu_count=count,
                      gpu_request=1.0 if count > 1 else rng.choice([0.25, 0.5, 1.0]),
                      gpu_model=rng.choice([None, "A100", "T4"]), exclusion=rng.choice(["", "red"]))
        state = ClusterState.from_snapshot(snap)
        ours = preempt_on(state, req, range(len(nodes)))
        found = find_preemption(ClusterState.from_snapshot(snap), req) if req.priority > 0 else None
        assert ours == (found[:2] if found else None)  # (choice, victims); find_preemption adds the holdings


def test_run_lengths_follow_the_owner_who_always_stops_early_once_enough_of_theirs_ended():
    lengths = RunLengths(min_samples=3)
    for _ in range(3):
        lengths.observe(900, 3600, keys=[("owner", "ann"), ("team", "nlp")])  # ann stops after a quarter
    for _ in range(6):
        lengths.observe(3600, 3600, keys=[("owner", "bob"), ("team", "nlp")])  # bob uses all of it
    assert lengths.end(0, 3600, now=100, keys=[("owner", "ann"), ("team", "nlp")]) == 900
    assert lengths.end(0, 3600, now=100, keys=[("owner", "bob"), ("team", "nlp")]) == 3600
    # Someone with too few ended reservations of their own: their team's.
    assert lengths.end(0, 3600, now=100, keys=[("owner", "cy"), ("team", "nlp")]) == 3600
    assert lengths.run(7200, keys=[("owner", "ann")]) == 1800


def test_too_few_ended_reservations_teach_nothing_the_expiry_stands():
    lengths = RunLengths()
    lengths.observe(60, 3600)
    assert lengths.end(0, 3600, now=100) == 3600 and lengths.run(3600) == 3600


def test_a_borrowed_share_being_reclaimed_ends_at_its_reclaim_time():
    snap = Snapshot((make_node("a1", shares={0: [busy("lent", team="b", admission="borrowed",
                                                      reclaim_at=NOW + 300)]}),))
    out = estimate_starts(snap, [Request("mine", team="a")], {}, now=NOW)
    assert out["mine"].start == NOW + 300 and "lent" in out["mine"].reason
    # A known end before the reclaim time still comes first.
    assert estimate_starts(snap, [Request("mine", team="a")], {"lent": NOW + 60}, now=NOW)["mine"].start == NOW + 60


def test_after_a_cycle_the_forecast_sees_what_it_placed_preempted_and_warned():
    from scheduler.core import Placement
    from scheduler.core.forecast import after_cycle

    snap = Snapshot((make_node("a1", gpus=2, shares={0: [busy("old", priority=0)], 1: [busy("lent")]}),), now=NOW)
    placed = Request("new", priority=5, cpu_milli=1000)
    after = after_cycle(snap, [(placed, Placement("new", "a1", ("a1-g0",), (0,), 1.0, 0))], gone=["old"],
                        reclaim_at={"lent": NOW + 600})
    gpus = after.nodes[0].gpus
    assert [s.reservation_id for s in gpus[0].shares] == ["new"] and gpus[0].shares[0].priority == 5
    assert gpus[1].shares[0].reclaim_at == NOW + 600
    # The next request waits for the share being reclaimed, not for the one the cycle preempted.
    out = estimate_starts(after, [Request("next")], {}, now=NOW)
    assert out["next"].start == NOW + 600
    assert after_cycle(snap, []) is snap


def test_work_evicted_in_the_forecast_waits_again_and_goes_before_younger_work():
    # "mine" evicts "spare-time" when "guaranteed" ends. Evicted, "spare-time" waits again with
    # its first submission, older than "young": it takes half the GPU when "mine" ends, and "young"
    # (a whole GPU) waits for it to end too, as in the cycle.
    snap = Snapshot((make_node("a1", shares={0: [busy("guaranteed", 0.5, team="nlp", priority=1),
                                                  busy("spare-time", 0.5, team="ops", priority=0)]}),))
    queue = [Request("mine", team="vision", priority=2), Request("young", team="ops", created_at=NOW - 5)]
    running = {"spare-time": Request("spare-time", team="ops", gpu_request=0.5, created_at=0.0)}
    durations = {"mine": 3600.0, "spare-time": 1800.0}
    ends = {"guaranteed": NOW + 300, "spare-time": NOW + 100_000}
    gone = estimate_starts(snap, queue, ends, now=NOW, durations=durations, order=QueueOrder(snap))
    again = estimate_starts(snap, queue, ends, now=NOW, durations=durations, order=QueueOrder(snap),
                            requeue=running)
    assert gone["mine"].start == again["mine"].start == NOW + 300
    assert gone["young"].start == NOW + 300 + 3600  # the victim vanished for good
    assert again["young"].start == NOW + 300 + 3600 + 1800
    assert "spare-time" not in again
