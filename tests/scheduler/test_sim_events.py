"""The multi-tenant trace and its discrete-event replay through the engine, on a small fleet."""

from __future__ import annotations

import pytest

from scheduler.sim.events import Simulation, kth_end, simulate
from scheduler.sim.tenants import HOUR, Pool, TenantConfig, generate

SMALL = TenantConfig(seed=7, departments=2, teams=4, horizon_s=6 * HOUR,
                     pools=(Pool("A100", 2, 4, 40960), Pool("T4", 3, 2, 15360)))


@pytest.fixture(scope="module")
def trace():
    return generate(SMALL)


@pytest.fixture(scope="module")
def result(trace):
    return simulate(trace, cycle_s=120, estimate_s=600)


def test_the_trace_is_the_same_for_the_same_seed_and_differs_for_another(trace):
    again = generate(SMALL)
    assert again.jobs == trace.jobs and again.teams == trace.teams
    other = generate(TenantConfig(**{**SMALL.__dict__, "seed": 8}))
    assert other.jobs != trace.jobs


def test_the_trace_asks_for_the_load_it_was_given(trace):
    asked = sum(j.gpu_seconds for j in trace.jobs)
    assert asked == pytest.approx(1.3 * trace.gpus * SMALL.horizon_s, rel=0.1)
    assert all(0 <= j.arrival < SMALL.horizon_s for j in trace.jobs)
    assert [j.arrival for j in trace.jobs] == sorted(j.arrival for j in trace.jobs)


def test_the_trace_has_the_mix_it_promises(trace):
    jobs = trace.jobs
    assert {t.department for t in trace.teams} == {d.name for d in trace.departments}
    assert any(j.interactive for j in jobs) and any(not j.interactive for j in jobs)
    assert all(j.duration <= j.max_duration for j in jobs if j.interactive)
    assert any(j.gpu_request < 1 for j in jobs) and any(j.gpu_count > 1 for j in jobs)
    assert any(j.priority == 0 for j in jobs) and any(j.priority > 0 for j in jobs)
    assert {j.gpu_model for j in jobs} >= {"A100", "T4", None}
    # No job asks for more GPUs of its model than one node holds.
    assert all(j.gpu_count <= 2 for j in jobs if j.gpu_model == "T4")
    demand = sorted(t.demand for t in trace.teams)
    assert sum(demand) == pytest.approx(1.0) and demand[-1] > 2 * demand[0]  # skewed


def test_every_job_ends_up_finished_running_or_waiting(trace, result):
    ids = {j.id for j in trace.jobs}
    parts = [result.finished, result.running, result.waiting, result.not_arrived]
    assert set().union(*parts) == ids
    assert sum(len(p) for p in parts) == len(ids)  # no job in two places


def test_the_queue_drains_after_the_last_arrival(result, trace):
    assert result.finished == {j.id for j in trace.jobs}
    for log in result.jobs.values():
        assert log.starts and log.starts[0] >= log.job.arrival
        assert log.ended == pytest.approx(log.starts[-1] + log.job.duration, abs=1e-6)
        assert len(log.causes) == len(log.starts)


def test_a_stopped_run_keeps_every_job_somewhere(trace):
    stopped = simulate(trace, cycle_s=120, estimate_s=600, until_s=3 * HOUR)
    assert stopped.running and (stopped.waiting or stopped.not_arrived)
    parts = [stopped.finished, stopped.running, stopped.waiting, stopped.not_arrived]
    assert sum(len(p) for p in parts) == len(trace.jobs)


def test_the_replay_is_deterministic_per_seed(trace, result):
    again = simulate(trace, cycle_s=120, estimate_s=600)
    assert {k: (v.starts, v.ended, v.preempted, v.estimates) for k, v in again.jobs.items()} == {
        k: (v.starts, v.ended, v.preempted, v.estimates) for k, v in result.jobs.items()}


def test_a_preempted_job_goes_back_to_the_queue_and_runs_again(result):
    preempted = [log for log in result.jobs.values() if log.preempted]
    assert result.preemptions == sum(len(log.preempted) for log in preempted) > 0
    assert any("preempted others" in log.causes for log in result.jobs.values())
    for log in preempted:
        assert len(log.starts) == len(log.preempted) + 1
        assert all(p < s for p, s in zip(log.preempted, log.starts[1:], strict=True))


def test_waiting_jobs_get_estimates_that_the_backtest_can_score(result):
    waited = [log for log in result.jobs.values() if log.estimates]
    assert waited
    for log in waited:
        for name in ("forecast", "forecast_order", "forecast_learnt", "kth_end"):
            for made_at, start, code in log.estimates[name]:
                assert log.start_after(made_at) is not None
                assert start is None or start >= made_at
                assert code
    assert any(start is not None for log in waited for _, start, _ in log.estimates["forecast"])


def test_the_old_rule_takes_the_kth_known_end_whatever_the_model():
    from scheduler.core import Request

    queue = [Request("late", priority=1, created_at=5), Request("first", priority=3, created_at=9)]
    out = kth_end(queue, {"a": 500.0, "b": 100.0}, now=50.0)
    assert out["first"].start == 100.0 and out["late"].start == 500.0


def test_hooks_shape_the_snapshot_and_see_every_decision(trace):
    seen, snaps = [], []

    def extra(sim):
        snaps.append(sim.now)
        return {"teams": {}}

    def decided(sim, decision):
        seen.append(decision)
        for p in decision if isinstance(decision, tuple) else ():
            sim.running[p.request_id].extra["node"] = p.node

    sim = Simulation(trace, cycle_s=600, estimate_s=3600, until_s=2 * HOUR, snapshot_extra=extra,
                     share_extra=lambda run: {"team": run.job.team.upper()}, on_decision=decided, estimators={})
    sim.run()
    assert snaps and seen
    assert all(run.extra.get("node") == sim.nodes[run.node].name for run in sim.running.values()
               if "node" in run.extra)
    assert all(sim.share_of(run).team == run.job.team.upper() for run in sim.running.values())
    assert sim.snapshot().teams == {}
