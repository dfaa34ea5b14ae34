"""Victims that tie (same rank, same size) go in the order they were first placed, and a preemption
option that was tried and rolled back does not change that order."""

import pytest

from scheduler.core import Preemption, Request, Share, Snapshot, Unschedulable, decide

AFFINITY_ELSEWHERE = Request("wants-a", gpu_request=0.5, priority=10, team="w", affinity=frozenset({"a"}),
                             created_at=1.0)
PLAIN = Request("plain", gpu_request=0.5, priority=10, team="w", created_at=2.0)


def cluster(node) -> Snapshot:
    # Two equal opportunistic shares fill n0's GPU; n1's GPU is full with the only "a" share.
    return Snapshot((
        node("n0", shares={0: [Share("first", 0.5, priority=0, team="x"), Share("second", 0.5, priority=0, team="y")]}),
        node("n1", shares={0: [Share("anchor", 1.0, priority=50, team="z", affinity=frozenset({"a"}))]}),
    ))


@pytest.mark.parametrize("after_a_rollback", [False, True], ids=["alone", "after-a-rolled-back-option"])
def test_equal_victims_go_in_the_order_they_were_first_placed(node, after_a_rollback):
    pending = [AFFINITY_ELSEWHERE, PLAIN] if after_a_rollback else [PLAIN]
    decisions = {d.request_id: d for d in decide(cluster(node), pending)}
    if after_a_rollback:
        # Its only option evicts "first" on n0, then fails the affinity filter (the "a" share is on
        # n1) and is put back.
        assert isinstance(decisions["wants-a"], Unschedulable)
    taken = decisions["plain"]
    assert isinstance(taken, Preemption)
    assert taken.victims == ("first",)
    assert taken.placement.node == "n0"
