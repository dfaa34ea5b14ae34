"""What a placement cycle reads: the fleet from its cache (not the node and GPU tables on every
cycle), a constant number of statements however many reservations it places, and a snapshot that
holds exactly the live shares."""

from __future__ import annotations

import difflib
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.fleet.models import Gpu
from portal.placement import fleet_cache, queue, snapshot, tasks
from portal.placement.commit import Batches, CycleReport
from portal.placement.locking import Lease
from portal.reservations.models import Allocation, Reservation
from portal.reservations.rules import ReservationSpec
from portal.reservations.services import submit
from portal.reservations.states import State
from scheduler import core
from tests.teams import set_any_quota

pytestmark = pytest.mark.django_db(transaction=False)


def _submit(people, teams, n: int, share: str = "0.25") -> list[int]:
    return [submit(people["alice"], ReservationSpec(team=teams["vision"], image="img", gpu_request=Decimal(share),
                                                    gpu_memory_mib=1024)).pk for _ in range(n)]


def _cycle_statements(django_capture_on_commit_callbacks) -> list[str]:
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=False):
        tasks.run_cycles("test")
    return [q["sql"] for q in queries]


def test_a_cycle_runs_the_same_statements_for_one_placement_or_many(people, teams, cluster,
                                                                    django_capture_on_commit_callbacks):
    set_any_quota(teams["vision"], share=100, gpus=100)
    fleet_cache.fleet()  # the process has seen this fleet (a worker has, after its first cycle)
    queue.run_lengths()  # and learnt how long reservations run and what arrives (kept for minutes)
    queue.arrivals()
    _submit(people, teams, 1)
    one = _cycle_statements(django_capture_on_commit_callbacks)
    _submit(people, teams, 12)
    many = _cycle_statements(django_capture_on_commit_callbacks)
    assert Reservation.objects.filter(state=State.PLACED).count() == 13
    assert len(many) == len(one), "\n".join(difflib.unified_diff([s[:150] for s in one], [s[:150] for s in many],
                                                                lineterm=""))


def test_a_cycle_does_not_read_the_node_and_gpu_tables_while_the_fleet_is_unchanged(
        people, teams, cluster, django_capture_on_commit_callbacks):
    fleet_cache.fleet()  # the process has seen this fleet (a worker has, after its first cycle)
    _submit(people, teams, 2)
    statements = _cycle_statements(django_capture_on_commit_callbacks)
    assert Reservation.objects.filter(state=State.PLACED).count() == 2
    whole_tables = [s for s in statements if ('FROM "fleet_gpu"' in s or 'FROM "fleet_node"' in s)
                    and " IN (" not in s and " = ANY(" not in s]  # an id list: IN, or an array on PostgreSQL
    assert whole_tables == []


def test_the_snapshot_holds_the_live_shares_and_leaves_other_nodes_blank(people, teams, placement_loop):
    ids = _submit(people, teams, 3, "0.5")
    placement_loop()
    built = snapshot.build()
    live = {(uuid, str(rid)) for uuid, rid in Allocation.objects.filter(released_at__isnull=True)
            .values_list("gpu__uuid", "reservation_id")}
    assert {str(rid) for _, rid in live} == {str(i) for i in ids}
    assert {(g.uuid, s.reservation_id) for n in built.nodes for g in n.gpus for s in g.shares} == live
    fleet = fleet_cache.fleet()
    busy = {uuid for uuid, _ in live}
    for node, blank in zip(built.nodes, fleet.blanks, strict=True):
        holds = any(g.uuid in busy for g in node.gpus)
        assert (node is blank) != holds, node.name


def test_a_gpu_gone_before_the_commit_is_a_lost_race(people, teams, cluster):
    """The commit names GPUs by the fleet it decided on; one deleted since is refused, not placed."""
    (rid,) = _submit(people, teams, 1)
    gpu = Gpu.objects.select_related("node").order_by("pk").first()
    placement = core.Placement(str(rid), gpu.node.name, (gpu.uuid,), (gpu.index,), 0.25, 1024, 0.0)
    Allocation.objects.filter(gpu=gpu).delete()
    gpu.delete()
    report = CycleReport()
    batches = Batches(Lease(1, "1"), lambda: True, lambda placed, evicted: None,
                      {str(rid): snapshot.pending([rid])[0]}, report)
    batches.add((placement,))
    assert batches.commit()
    assert report.placed == [] and report.conflicts == 1
    assert batches.waiting[str(rid)].startswith("placement lost a race")
    assert Reservation.objects.get(pk=rid).state == State.PENDING
