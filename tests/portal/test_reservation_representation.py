"""The reservation answers (list, retrieve, cancel, submit) render through shared fields and one
query for what they show from other tables (portal.api.representation, reservation_related):
the JSON must be DRF's generic rendering of the rows loaded the old way, byte for byte, over
reservations in every shape; and the work per answer stays pinned."""

from __future__ import annotations

from decimal import Decimal
from unittest import mock

import pytest
from django.db.models import Prefetch
from django.utils import timezone
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from portal.api.filters import ReservationFilter
from portal.api.serializers import AllocationSerializer, ReservationSerializer
from portal.fleet.models import Gpu, Node
from portal.reservations import services
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import State
from portal.tenancy import roles
from portal.tenancy.models import TeamPolicy
from tests.reservations import clock_at, ended, placed, running, submitted
from tests.teams import set_any_quota


class GenericAllocationSerializer(AllocationSerializer):
    def to_representation(self, instance):
        return serializers.ModelSerializer.to_representation(self, instance)


class GenericReservationSerializer(ReservationSerializer):
    """ReservationSerializer as it was: DRF's generic rendering, a nested serializer per row."""

    class Meta(ReservationSerializer.Meta):
        list_serializer_class = serializers.ListSerializer

    def to_representation(self, instance):
        return serializers.ModelSerializer.to_representation(self, instance)

    def get_allocations(self, obj):
        live = [a for a in obj.allocations.all() if a.released_at is None]
        return GenericAllocationSerializer(live, many=True).data


def _old_way():
    """The rows as the viewset loaded them before: every relation joined, allocations prefetched."""
    return Reservation.objects.select_related("team", "owner", "node", "client_node").prefetch_related(
        Prefetch("allocations", queryset=Allocation.objects.select_related("gpu__node")))


def _generic(reservations) -> bytes:
    return JSONRenderer().render(GenericReservationSerializer(reservations, many=True).data)


@pytest.fixture
def varied(fleet, teams, people):
    """Reservations in every shape the answer takes: pending with defaults and with every option,
    placed, running on two GPUs, a remote share with its client node, one that ended (released
    allocations), one cancelled, one requeued after preemption (allocations released, node
    cleared), one whose client node is gone, one in the other team."""
    vision, nlp = teams["vision"], teams["nlp"]
    TeamPolicy.objects.create(team=vision, allow_remote=True)
    set_any_quota(vision, share=100, gpus=100)
    alice, carol, bob = people["alice"], people["alice2"], people["bob"]
    gpus = list(Gpu.objects.select_related("node").order_by("node__name", "index"))
    a100 = [g for g in gpus if g.node.name == "a100-node-1"]
    made = [submitted(alice, vision, gpu_request=Decimal("0.25"), gpu_memory_mib=4096)]
    made.append(submitted(carol, vision, gpu_request=Decimal("0.3"), gpu_limit=Decimal("0.75"), gpu_memory_mib=2048,
                          name="every-option", kind="interactive", command=["python", "-c", "print('é')", ""],
                          priority=70, affinity="aff", anti_affinity="anti", exclusion="secure",
                          group_name="gang", group_headcount=2, group_threshold=Decimal("0.5"),
                          max_duration_s=3600, requeue_on_preempt=True, remote_allowed=True))
    with clock_at(timezone.now() - timezone.timedelta(hours=2)):
        made.append(placed(submitted(alice, vision, gpu_request=Decimal("0.5"), gpu_memory_mib=8192,
                                     max_duration_s=7200), a100[0]))
    two = submitted(carol, vision, gpu_request=Decimal("1"), gpu_memory_mib=1024, gpu_count=2)
    services.place(two.pk, a100[1].node_id, [services.NewAllocation(a100[2].pk, Decimal("1"), 1024),
                                             services.NewAllocation(a100[1].pk, Decimal("1"), 1024)])
    assert services.move(two.pk, State.PLACED, State.RUNNING, "its pod runs")
    made.append(two)
    client = Node.objects.create(name="cpu-only", cpu_milli=16000, memory_mib=65536)
    gone = Node.objects.create(name="cpu-gone", cpu_milli=16000, memory_mib=65536)
    for client_node in (client, gone):
        remote = submitted(alice, vision, gpu_request=Decimal("0.2"), gpu_memory_mib=1024, remote_allowed=True)
        services.place_many([[services.Placing(remote.pk, a100[3].node_id,
                                               (services.NewAllocation(a100[3].pk, Decimal("0.2"), 1024),),
                                               sharing="remote", sharing_reason="no room for the pod",
                                               client_node_id=client_node.pk)]])
        made.append(remote)
    gone.delete()  # the reservation keeps its GPU node; its client node reads as null
    made.append(ended(running(submitted(alice, vision, gpu_request=Decimal("0.1"), gpu_memory_mib=512),
                              a100[4])))
    cancelled = submitted(carol, vision, gpu_request=Decimal("0.1"), gpu_memory_mib=512)
    services.cancel(cancelled.pk, carol)
    made.append(cancelled)
    requeued = placed(submitted(alice, vision, gpu_request=Decimal("0.1"), gpu_memory_mib=512,
                                requeue_on_preempt=True), a100[5])
    assert services.preempt(requeued.pk, "preempted by a test")
    made.append(requeued)
    made.append(submitted(bob, nlp, gpu_request=Decimal("0.25"), gpu_memory_mib=1024))
    return [r.pk for r in made]


def test_varied_fixture_has_every_shape(varied):
    rows = list(_old_way().filter(pk__in=varied))
    live = {r.pk: [a for a in r.allocations.all() if a.released_at is None] for r in rows}
    assert {r.state for r in rows} >= {"pending", "placed", "running", "succeeded", "cancelled"}
    assert any(len(a) == 2 for a in live.values()) and any(r.client_node_id for r in rows)
    assert any(r.sharing == "remote" and r.client_node_id is None for r in rows)
    assert any(r.allocations.all() and not live[r.pk] for r in rows)  # released allocations only
    assert any(r.expires_at and r.placed_at for r in rows) and any(r.group_threshold for r in rows)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/St_Johns"])
def test_fast_rendering_is_drfs_generic_one(varied, zone):
    with timezone.override(zone):
        expected = _generic(list(_old_way().filter(pk__in=varied).order_by("pk")))
        rows = list(Reservation.objects.filter(pk__in=varied).order_by("pk"))
        assert JSONRenderer().render(ReservationSerializer(rows, many=True).data) == expected
        one_by_one = [ReservationSerializer(Reservation.objects.get(pk=pk)).data for pk in sorted(varied)]
        assert JSONRenderer().render(one_by_one) == expected


def test_api_answers_are_drfs_generic_ones(varied, client_for, people):
    admin = client_for("admin")
    listed = admin.get("/api/v1/reservations/", {"page_size": "500"})
    assert listed.status_code == 200
    assert JSONRenderer().render(listed.json()["results"]) == _generic(list(_old_way().filter(pk__in=varied)))
    assert listed.content.startswith(b'{"count":%d,' % len(varied))
    for pk in varied:
        one = admin.get(f"/api/v1/reservations/{pk}/")
        assert one.content == _generic([_old_way().get(pk=pk)])[1:-1]
    running_pk = next(pk for pk in varied if Reservation.objects.get(pk=pk).state == State.RUNNING)
    cancelled = admin.post(f"/api/v1/reservations/{running_pk}/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.content == _generic([_old_way().get(pk=running_pk)])[1:-1]
    assert cancelled.json()["state"] == "cancelled" and cancelled.json()["allocations"] == []
    again = admin.post(f"/api/v1/reservations/{running_pk}/cancel/")  # a no-op answers the same row
    assert again.content == cancelled.content


def test_submit_answer_is_drfs_generic_one(fleet, client_for, reservation_body):
    made = client_for("alice").post("/api/v1/reservations/", reservation_body(name="x", command=["a"]), format="json")
    assert made.status_code == 201
    assert made.content == _generic([_old_way().get(pk=made.json()["id"])])[1:-1]


def test_a_list_builds_no_serializer_fields_per_answer(varied, client_for):
    alice = client_for("alice")
    alice.get("/api/v1/reservations/")  # the shared fields are built once per process
    with mock.patch.object(serializers.ModelSerializer, "get_fields", side_effect=AssertionError("built fields")):
        assert alice.get("/api/v1/reservations/").status_code == 200
        assert alice.get(f"/api/v1/reservations/{varied[2]}/").status_code == 200


def test_a_list_builds_its_filter_set_only_when_asked(varied, client_for):
    alice = client_for("alice")
    with mock.patch.object(ReservationFilter, "__init__", side_effect=AssertionError("built a filter set")):
        assert alice.get("/api/v1/reservations/", {"page_size": "5", "page": "2"}).status_code == 200
    running = alice.get("/api/v1/reservations/", {"state": "running"}).json()["results"]
    assert running and {r["state"] for r in running} == {"running"}
    assert alice.get("/api/v1/reservations/", {"state": "bogus"}).json() == {
        "state": ["Select a valid choice. bogus is not one of the available choices."]}
    assert alice.get("/api/v1/reservations/", {"stat": "running"}).status_code == 400  # unknown, as before


# Each request below reads the user's roles first (one query; forgotten before, as a new
# request's user has none cached).

def test_list_queries_are_pinned(varied, client_for, people, django_assert_num_queries):
    alice = client_for("alice")
    roles.forget_roles(people["alice"])
    with django_assert_num_queries(4) as captured:  # roles, count, page, then names and allocations in one
        body = alice.get("/api/v1/reservations/", {"page_size": "20"}).json()
    assert body["count"] == len(varied) - 1 and any(r["allocations"] for r in body["results"])
    count, page = (q["sql"] for q in captured.captured_queries[1:3])
    assert "SELECT COUNT(*)" in count and "(SELECT" not in count and "JOIN" not in page  # no subquery, no joins
    roles.forget_roles(people["alice"])
    with django_assert_num_queries(4):
        assert alice.get("/api/v1/reservations/", {"state": ["running", "placed"]}).status_code == 200


def test_retrieve_queries_are_pinned(varied, client_for, people, django_assert_num_queries):
    roles.forget_roles(people["alice"])
    with django_assert_num_queries(3):  # roles, the row, names and allocations
        assert client_for("alice").get(f"/api/v1/reservations/{varied[3]}/").json()["allocations"]


def test_cancel_queries_are_pinned(varied, client_for, people, django_assert_num_queries):
    pending = varied[0]  # alice's own
    roles.forget_roles(people["alice"])
    # roles, the row (id, team, owner); the service's transaction (a savepoint here, and its
    # release): the row locked, its update, its audit row; then names and allocations to answer.
    with django_assert_num_queries(8):
        assert client_for("alice").post(f"/api/v1/reservations/{pending}/cancel/").status_code == 200
