"""Estimated starts around planned drains: a node planned for maintenance takes no new work over
its window, and takes work again after it."""

from __future__ import annotations

from scheduler.core import NodeStatus, PlannedDrain, Request, Share, Snapshot
from scheduler.core.forecast import estimate_starts

from .conftest import make_node

NOW = 1000.0
MIN = 60.0
HOUR = 3600.0


def _two_busy_nodes() -> Snapshot:
    # "soon" frees its GPU in 30 min, "far" in 2 h.
    return Snapshot((
        make_node("soon", shares={0: [Share("short", 1.0)]}),
        make_node("far", shares={0: [Share("long", 1.0)]}),
    ))


ENDS = {"short": NOW + 30 * MIN, "long": NOW + 2 * HOUR}


def test_a_node_drained_before_its_gpu_frees_is_not_counted_on():
    snap = _two_busy_nodes()
    without = estimate_starts(snap, [Request("mine")], ENDS, now=NOW)
    assert without["mine"].start == NOW + 30 * MIN

    drain = PlannedDrain("soon", NOW + 10 * MIN, None)
    out = estimate_starts(snap, [Request("mine")], ENDS, now=NOW, drains=[drain])
    assert out["mine"].start == NOW + 2 * HOUR
    assert "long" in out["mine"].reason and "far" in out["mine"].reason


def test_the_drained_node_takes_work_again_at_the_drains_end():
    drain = PlannedDrain("soon", NOW + 10 * MIN, NOW + HOUR)
    out = estimate_starts(_two_busy_nodes(), [Request("mine")], ENDS, now=NOW, drains=[drain])
    assert out["mine"].start == NOW + HOUR
    assert out["mine"].code == "after_ends"
    assert "planned drain of soon ends" in out["mine"].reason


def test_work_that_fits_before_the_drain_starts_now():
    snap = Snapshot((make_node("soon", gpus=2, shares={0: [Share("short", 1.0)]}),))
    drain = PlannedDrain("soon", NOW + 10 * MIN, None)
    out = estimate_starts(snap, [Request("mine")], {"short": NOW + 30 * MIN}, now=NOW, drains=[drain])
    assert out["mine"].start == NOW


def test_a_node_a_plan_drains_now_counts_again_after_the_plans_end():
    snap = Snapshot((
        make_node("v1", model="V100", status=NodeStatus.DRAINING),
        make_node("a1", model="A100", shares={0: [Share("a-job", 1.0)]}),
    ))
    ends = {"a-job": NOW + 600}
    assert estimate_starts(snap, [Request("mine", gpu_model="V100")], ends, now=NOW)["mine"].code == "no_ready_gpu"

    drain = PlannedDrain("v1", NOW - 10 * MIN, NOW + 2 * HOUR)
    out = estimate_starts(snap, [Request("mine", gpu_model="V100")], ends, now=NOW, drains=[drain])
    assert out["mine"].start == NOW + 2 * HOUR
    assert "planned drain of v1 ends" in out["mine"].reason


def test_a_lost_node_does_not_come_back_at_its_drains_end():
    snap = Snapshot((make_node("v1", model="V100", status=NodeStatus.LOST),))
    drain = PlannedDrain("v1", NOW - 10 * MIN, NOW + HOUR)
    out = estimate_starts(snap, [Request("mine", gpu_model="V100")], {}, now=NOW, drains=[drain])
    assert out["mine"].start is None and out["mine"].code == "no_ready_gpu"


def test_work_that_only_an_open_ended_drained_node_could_take_has_no_estimate_and_says_why():
    snap = Snapshot((
        make_node("v1", model="V100", shares={0: [Share("v-job", 1.0)]}),
        make_node("a1", model="A100"),
    ))
    drain = PlannedDrain("v1", NOW + 10 * MIN, None)
    out = estimate_starts(snap, [Request("mine", gpu_model="V100")], {"v-job": NOW + 30 * MIN}, now=NOW,
                          drains=[drain])
    assert out["mine"].start is None
    assert out["mine"].code == "no_ready_gpu"
    assert "planned drain" in out["mine"].reason


def test_a_drain_of_a_node_with_room_elsewhere_changes_nothing():
    snap = Snapshot((make_node("soon", shares={0: [Share("short", 1.0)]}), make_node("free")))
    drain = PlannedDrain("soon", NOW + 10 * MIN, None)
    out = estimate_starts(snap, [Request("mine")], {"short": NOW + 30 * MIN}, now=NOW, drains=[drain])
    assert out["mine"].start == NOW and out["mine"].code == "now"
