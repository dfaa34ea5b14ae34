"""The reservation services that events and pages call: the compare-and-set move, release, node
loss with its cause, and a kubectl submission that names its pod in the same write."""

from __future__ import annotations

from decimal import Decimal

import pytest

from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, LostCause, Node, NodeStatus
from portal.reservations import rules, services
from portal.reservations.models import Allocation, Reservation, Source
from portal.reservations.states import State
from tests.reservations import placed, submitted


def _submit(people, teams, **spec) -> Reservation:
    return submitted(people["alice"], teams["vision"], **({"gpu_request": Decimal("0.5"), "gpu_memory_mib": 1000}
                                                         | spec))


def _placed(people, teams, **spec) -> Reservation:
    return placed(_submit(people, teams, **spec), Gpu.objects.get(node__name="t4-node-1", index=0))


def test_move_acts_only_from_the_expected_state(fleet, people, teams):
    r = _placed(people, teams)
    assert services.move(r.pk, State.RUNNING, State.SUCCEEDED, "a late event") is False
    assert services.move(r.pk, State.PLACED, State.RUNNING, "pod running") is True
    assert services.move(r.pk, State.PLACED, State.RUNNING, "the same event again") is False
    assert services.move(r.pk, (State.PLACED, State.RUNNING), State.SUCCEEDED, "done") is True
    assert services.move(10**9, State.PENDING, State.CANCELLED, "gone") is False
    assert [t.to_state for t in Reservation.objects.get(pk=r.pk).transitions.all()] == [
        "pending", "placed", "running", "succeeded"]


def test_release_ends_a_hold_and_gives_the_share_back(fleet, people, teams):
    r = _placed(people, teams)
    assert services.release(r.pk, State.FAILED, "the cluster refused the pod") is True
    assert services.release(r.pk, State.FAILED, "again") is False
    assert not Allocation.objects.filter(reservation=r, released_at__isnull=True).exists()
    with pytest.raises(ValueError):
        services.release(r.pk, State.RUNNING, "running holds GPUs")


def test_lost_node_requeues_by_team_policy_and_records_its_cause(fleet, people, teams):
    kept = _placed(people, teams)
    teams["vision"].requeue_on_node_lost = False
    teams["vision"].save()
    failed = _placed(people, teams, gpu_request=Decimal("0.25"))
    teams["vision"].requeue_on_node_lost = True
    teams["vision"].save()
    node = Node.objects.get(name="t4-node-1")
    assert fleet_services.mark_lost(node.pk, LostCause.CLUSTER_NOT_READY, "the cluster reports the node not ready")
    assert services.lose(kept.pk, "node t4-node-1 is not ready") is True
    assert Reservation.objects.get(pk=kept.pk).state == State.PENDING
    teams["vision"].requeue_on_node_lost = False
    teams["vision"].save()
    assert services.lose(failed.pk, "node t4-node-1 is not ready") is True
    assert Reservation.objects.get(pk=failed.pk).state == State.FAILED
    # The agent reporting again does not undo a loss the cluster reported; the cluster does.
    node.refresh_from_db()
    assert (node.status, node.lost_cause) == (NodeStatus.LOST, LostCause.CLUSTER_NOT_READY)
    assert fleet_services.mark_back(node.pk, LostCause.AGENT_SILENT) is False
    assert fleet_services.mark_back(node.pk, LostCause.CLUSTER_NOT_READY) is True
    node.refresh_from_db()
    assert (node.status, node.lost_cause, node.status_reason) == (NodeStatus.READY, "", "")


def test_kubectl_submission_names_its_pod_in_the_same_write(fleet, people, teams):
    class Pod:
        namespace, name, uid = "vision", "notebook", "uid-1"

    spec = rules.ReservationSpec(team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.5"),
                                 gpu_memory_mib=1000)
    r = services.submit(people["alice"], spec, source=Source.KUBECTL, pod=Pod())
    r.refresh_from_db()
    assert (r.source, r.pod_namespace, r.pod_name, r.pod_uid) == ("kubectl", "vision", "notebook", "uid-1")
    with pytest.raises(ValueError):
        services.submit(people["alice"], spec, source=Source.KUBECTL)
