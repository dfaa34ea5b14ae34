"""Estimated starts that count the work still to come: a team that keeps submitting ahead of a
waiting request pushes its start back, as it will in the cycle."""

from __future__ import annotations

from scheduler.core import Request, Share, Snapshot, TeamUsage
from scheduler.core.forecast import Arrivals, QueueOrder, estimate_starts
from scheduler.core.forecast.arrivals import PREFIX

from .conftest import make_node

NOW = 100_000.0
HOUR = 3600.0


def learnt(team: str, every_s: float, run_s: float, priority: int = 1, **kw) -> Arrivals:
    """A day of `team` submitting one-GPU A100 requests every `every_s`, each run `run_s`."""
    arrivals = Arrivals()
    t = NOW - arrivals.window_s + every_s / 2
    k = 0
    while t < NOW:
        arrivals.observe(t, Request(f"past-{k}", team=team, gpu_model="A100", priority=priority, **kw), run_s)
        t += every_s
        k += 1
    return arrivals


def cluster(heavy_uses: float) -> Snapshot:
    """Two A100s, both held (one ends in 1 h, one in 2 h); team heavy holds `heavy_uses` of its 1-GPU quota."""
    node = make_node("a1", gpus=2, shares={0: [Share("r1", 1.0, team="heavy", priority=5)],
                                           1: [Share("r2", 1.0, team="heavy", priority=5)]})
    teams = {"heavy": TeamUsage(1.0, heavy_uses), "light": TeamUsage(4.0, 0.0)}
    return Snapshot((node,), now=NOW, teams=teams)


def test_the_stream_is_the_rate_seen_with_the_shapes_and_run_lengths_seen():
    arrivals = learnt("light", every_s=HOUR, run_s=1800.0, gpu_memory_mib=500)
    coming = arrivals.forward(NOW, horizon_s=6 * HOUR)
    assert len(coming) == 6  # one an hour, as in the last day
    assert [round((e.at - NOW) / HOUR, 2) for e in coming] == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]
    assert all(e.run_s == 1800.0 and e.request.team == "light" and e.request.gpu_memory_mib == 500 for e in coming)
    assert all(e.request.id.startswith(PREFIX) and e.request.created_at == e.at for e in coming)
    assert coming == learnt("light", every_s=HOUR, run_s=1800.0, gpu_memory_mib=500).forward(NOW, horizon_s=6 * HOUR)


def test_a_few_arrivals_teach_nothing():
    arrivals = learnt("light", every_s=4 * HOUR, run_s=1800.0)
    assert len(arrivals) < arrivals.min_arrivals
    assert arrivals.forward(NOW) == []


def test_a_team_below_its_share_that_keeps_arriving_goes_ahead_of_a_waiting_request():
    snap = cluster(heavy_uses=4.0)  # two GPUs here, two elsewhere
    mine = Request("mine", team="heavy", gpu_model="A100", priority=1, created_at=NOW)
    ends = {"r1": NOW + HOUR, "r2": NOW + 2 * HOUR}
    order = QueueOrder(snap, aging_s=0)  # no aging: the team's use decides, as under fair share
    alone = estimate_starts(snap, [mine], ends, now=NOW, order=order, durations={})
    assert alone["mine"].start == NOW + HOUR

    # light submits a 3-hour request every 30 minutes: each takes the GPU that frees first.
    coming = learnt("light", every_s=1800.0, run_s=3 * HOUR).forward(NOW)
    out = estimate_starts(snap, [mine], ends, now=NOW, order=QueueOrder(snap, aging_s=0), arrivals=coming,
                          withhold=False)
    assert set(out) == {"mine"}  # the expected arrivals get no answer of their own
    assert out["mine"].start is not None and out["mine"].start > NOW + 2 * HOUR

    # Told honestly: light's work takes every GPU that frees for as far as the forecast looks.
    told = estimate_starts(snap, [mine], ends, now=NOW, order=QueueOrder(snap, aging_s=0), arrivals=coming,
                           arrivals_until=NOW + 12 * HOUR)["mine"]
    assert told.start is None and told.code == "arrivals" and told.withheld == out["mine"].start
    assert told.reason.startswith("no estimate: it would start more than 12 h from now")


def test_a_start_that_rests_mainly_on_work_not_yet_submitted_is_not_given():
    snap = cluster(heavy_uses=4.0)
    mine = Request("mine", team="heavy", gpu_model="A100", priority=1, created_at=NOW)
    ends = {"r1": NOW + HOUR, "r2": NOW + 2 * HOUR}
    # light submits a 90-minute request every 40 minutes: the first two GPUs that free go to it.
    coming = learnt("light", every_s=2400.0, run_s=1.5 * HOUR).forward(NOW, horizon_s=3 * HOUR)
    told = estimate_starts(snap, [mine], ends, now=NOW, order=QueueOrder(snap, aging_s=0), arrivals=coming,
                           arrivals_until=NOW + 12 * HOUR)["mine"]
    assert told.start is None and told.code == "arrivals" and told.withheld is not None
    assert "work not yet submitted" in told.reason and "A100" in told.reason


def test_arrivals_that_rank_behind_only_take_room_the_request_cannot_use():
    snap = cluster(heavy_uses=0.0)
    mine = Request("mine", team="heavy", gpu_model="A100", priority=1, created_at=NOW)
    ends = {"r1": NOW + HOUR, "r2": NOW + 2 * HOUR}
    coming = learnt("light", every_s=1800.0, run_s=3 * HOUR, priority=1).forward(NOW)
    # heavy is below its share now (0 of 1), light at 0 of 4: heavy's request ranks first at the end.
    out = estimate_starts(snap, [mine], ends, now=NOW, order=QueueOrder(snap, aging_s=0), arrivals=coming)
    assert out["mine"].start == NOW + HOUR


def test_higher_priority_work_arriving_takes_the_gpu_first():
    snap = Snapshot((make_node("a1", gpus=1, shares={0: [Share("run", 1.0, team="other", priority=1)]}),), now=NOW)
    mine = Request("mine", team="heavy", gpu_model="A100", priority=0, created_at=NOW)
    ends = {"run": NOW + HOUR}
    alone = estimate_starts(snap, [mine], ends, now=NOW, order=QueueOrder(snap, aging_s=0), durations={"mine": HOUR})
    assert alone["mine"].start == NOW + HOUR

    # Priority-5 work that arrives every 20 minutes (the first at 10) and runs 10 minutes queues
    # behind the running one: the GPU goes to that backlog first, the last of it arriving at 1 h 50.
    coming = learnt("light", every_s=1200.0, run_s=600.0, priority=5).forward(NOW, horizon_s=2 * HOUR)
    out = estimate_starts(snap, [mine], ends, now=NOW, order=QueueOrder(snap, aging_s=0), durations={"mine": HOUR},
                          arrivals=coming, withhold=False)
    assert out["mine"].start == NOW + 2 * HOUR
