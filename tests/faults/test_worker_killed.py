"""`kill -9` of a Celery worker in the middle of a placement cycle (it holds the cycle's lease)
and in the middle of binding (decisions committed, pods not all created). Another worker takes
over; within the stated time everything placed has its one pod, nothing is over-committed, lost
or duplicated."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from portal.placement.locking import LEASE_KEY
from portal.reservations import rules, services
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import State
from tests.waiting import wait_for

from .conftest import assert_consistent, settle

pytestmark = [pytest.mark.timeout(300)]
CONVERGE_S = 60  # the lease of a killed holder expires after 10 s; the rest is cycles and binds


def _submit_many(stage, n: int) -> list[int]:
    ids = []
    for i in range(n):
        spec = rules.ReservationSpec(team=stage.team, image="pytorch/pytorch:2.3.0",
                                     gpu_request=Decimal("0.1") if i % 5 else Decimal("0.25"),
                                     gpu_memory_mib=512, priority=50)
        ids.append(services.submit(stage.user, spec).pk)
    return ids


def test_worker_killed_mid_cycle(stage):
    submitted = _submit_many(stage, 240)  # the cycle tasks wait in the broker: no worker yet
    lease = stage.redis.client()
    victim = stage.start_worker("victim")
    wait_for(lambda: lease.exists(LEASE_KEY), 60, "the worker takes the cycle's lease", every=0.002)
    committed = Allocation.objects.count()
    stage.kill9(victim)
    assert Reservation.objects.filter(state=State.PENDING).exists(), "the cycle was over before the kill"

    stage.start_worker("heir")
    took = settle(CONVERGE_S)
    assert_consistent(stage.team, submitted)
    assert Reservation.objects.filter(state=State.RUNNING).count() > 50
    print(f"killed mid-cycle with {committed} allocations committed; converged {took:.1f} s after the heir started")


def test_worker_killed_mid_bind(stage):
    submitted = _submit_many(stage, 120)
    victim = stage.start_worker("victim")
    # Decisions committed, pods not all made: reservations `placed` (a pod moves them to running).
    wait_for(lambda: Reservation.objects.filter(state=State.PLACED).exists(), 90,
             "the first decisions are committed", every=0.002)
    stage.kill9(victim)
    unbound = Reservation.objects.filter(state=State.PLACED).count()
    time.sleep(0.5)
    stage.start_worker("heir")
    took = settle(CONVERGE_S)
    assert_consistent(stage.team, submitted)
    print(f"killed with {unbound} placed without a pod; converged {took:.1f} s after the heir started")
