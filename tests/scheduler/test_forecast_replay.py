"""The estimated start by the engine itself (forecast.replay): told every end and arrival, it tells
each waiting job the start the cycle really gives it."""

from __future__ import annotations

import bisect
import math

import pytest

from scheduler.core import Request, Share, Snapshot
from scheduler.core.forecast import Expected
from scheduler.core.forecast.replay import replay_starts
from scheduler.sim.events import Simulation
from scheduler.sim.tenants import HOUR, Pool, TenantConfig, generate

from .conftest import make_node

NOW = 1000.0
SMALL = TenantConfig(seed=7, departments=2, teams=4, horizon_s=4 * HOUR,
                     pools=(Pool("A100", 2, 4, 40960), Pool("T4", 3, 2, 15360)))


def told_everything(sim: Simulation, snapshot: Snapshot, queue: list[Request]):
    """The replay told what the trace knows: every running job's real end and every job's real run
    time, and every job that arrives later."""
    ends = {jid: run.ends for jid, run in sim.running.items()}
    runs = {jid: job.duration for jid, job in sim.waiting.items()}
    runs.update({jid: run.job.duration for jid, run in sim.running.items()})
    jobs = sim.trace.jobs
    later = jobs[bisect.bisect_right(jobs, sim.now, key=lambda j: j.arrival):]
    coming = [Expected(j.arrival, j.request(), j.duration) for j in later]
    tick = (math.floor(sim.now / sim.cycle_s + 1e-9) + 1) * sim.cycle_s
    return replay_starts(snapshot, queue, ends, now=sim.now, durations=runs, arrivals=coming,
                         policy=sim.policy, aging_s=sim.aging_s, cycle_s=sim.cycle_s, tick_at=tick,
                         running={jid: run.job.request() for jid, run in sim.running.items()})


def test_told_every_end_and_arrival_the_replay_gives_every_waiting_job_its_real_start():
    sim = Simulation(generate(SMALL), cycle_s=120, estimate_s=600, estimators={"replay": told_everything})
    result = sim.run()
    compared = waited = 0
    for log in result.jobs.values():
        for made, start, _ in log.estimates.get("replay", []):
            actual = log.start_after(made)
            if actual is None:
                continue
            compared += 1
            waited += actual > made + sim.cycle_s
            assert start == pytest.approx(actual), (log.job.id, made, start, actual)
    assert result.preemptions > 0 and waited > 20  # the trace has queueing and preemption to get right


def busy(rid, request=1.0, **kw):
    return Share(rid, request, **kw)


def test_an_evicted_job_waits_again_and_starts_before_younger_work():
    # One GPU: a priority-0 batch job runs; a guarantee request evicts it at the next cycle. The
    # batch job, older than the other waiting one, takes the GPU back when the guarantee work ends.
    snap = Snapshot((make_node("a1", shares={0: [busy("batch")]}),), now=NOW)
    running = {"batch": Request("batch", created_at=0.0)}
    queue = [Request("urgent", priority=5, created_at=NOW - 10), Request("young", created_at=NOW - 5)]
    durations = {"urgent": 600.0, "batch": 1000.0}
    out = replay_starts(snap, queue, {}, now=NOW, durations=durations, running=running, tick_at=NOW + 60)
    assert out["urgent"].start == NOW + 60 and "batch" in out["urgent"].reason
    assert out["young"].start == NOW + 60 + 600 + 1000
    vanish = replay_starts(snap, queue, {}, now=NOW, durations=durations, running=running, tick_at=NOW + 60,
                           requeue=False)
    assert vanish["young"].start == NOW + 60 + 600  # as the walk has it: the victim gone for good


def test_a_start_waits_for_the_cycle_after_the_end_on_the_clock_grid():
    snap = Snapshot((make_node("a1", shares={0: [busy("job")]}),), now=NOW)
    out = replay_starts(snap, [Request("mine", created_at=NOW)], {"job": NOW + 90}, now=NOW, tick_at=NOW + 30)
    assert out["mine"].start == NOW + 90 and "job" in out["mine"].reason  # the portal cycles on an end
    free = Snapshot((make_node("a1"),), now=NOW)
    out = replay_starts(free, [Request("mine", created_at=NOW)], {}, now=NOW, tick_at=NOW + 30)
    assert out["mine"].start == NOW + 30 and out["mine"].code == "now"


def test_work_arriving_later_at_a_higher_priority_goes_first():
    snap = Snapshot((make_node("a1", shares={0: [busy("job", priority=5)]}),), now=NOW)  # nobody evicts it
    coming = [Expected(NOW + 100, Request("~expected:hi", priority=5, created_at=NOW + 100), 500.0)]
    out = replay_starts(snap, [Request("mine", created_at=NOW)], {"job": NOW + 200}, now=NOW, arrivals=coming)
    assert out["mine"].start == NOW + 700
    assert "~expected:hi" not in out


def test_without_a_known_end_there_is_no_estimate_and_the_reason_says_so():
    snap = Snapshot((make_node("a1", model="T4", shares={0: [busy("job")]}),), now=NOW)
    out = replay_starts(snap, [Request("mine", gpu_model="T4"), Request("v", gpu_model="V100")], {}, now=NOW)
    assert out["mine"].start is None and out["mine"].code == "unknown_ends"
    assert "without a known end" in out["mine"].reason
    assert out["v"].code == "no_ready_gpu" and "V100" in out["v"].reason


def test_bad_input_is_refused_with_the_field_named():
    snap = Snapshot((make_node("a1"),), now=NOW)
    with pytest.raises(ValueError, match="repeats"):
        replay_starts(snap, [Request("x"), Request("x")], {}, now=NOW)
    with pytest.raises(ValueError, match="cycle_s"):
        replay_starts(snap, [Request("x")], {}, now=NOW, cycle_s=0)
