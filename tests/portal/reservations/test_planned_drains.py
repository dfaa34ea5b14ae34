"""Planned drains (maintenance windows) through the services: bookings count the drained node's
GPUs out, planning over bookings is refused unless forced (then their owners are told), and the
periodic tick drains and returns the node on time without undoing what a person did by hand."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.errors import RuleViolation
from portal.fleet import drain_plans
from portal.fleet import services as fleet_services
from portal.fleet.models import DrainState, Node, NodeStatus, PlannedDrain
from portal.notifications.models import Notification
from portal.reservations import drain_effects, services
from portal.reservations.models import Reservation


@pytest.fixture
def t4(fleet):
    return Node.objects.get(name="t4-node-1")  # the fleet's only T4 node: 2 GPUs


@pytest.fixture
def admin(people):
    return audit.web(people["admin"])


def plan(node, by, start, end, reason="new power supply", force=False):
    return drain_effects.plan_drain(node, by, drain_plans.window_of(start, end, reason), force=force)[0]


def test_a_booking_over_a_planned_drain_is_refused_naming_the_drain(people, teams, t4, admin, booked, day):
    planned = plan(t4, admin, day, day + timedelta(hours=3))
    with pytest.raises(services.BookingConflict) as refused:
        booked(people["alice"], teams["vision"], day + timedelta(hours=1), 1)
    assert f"node t4-node-1 is drained for maintenance {drain_plans.window_text(day, day + timedelta(hours=3))}" \
           in str(refused.value)
    assert f"new power supply, plan #{planned.pk}" in str(refused.value)
    # the free windows offered avoid the drain: each ends by its start or starts after its end
    assert refused.value.free_windows
    for start, end in refused.value.free_windows:
        assert end <= day or start >= day + timedelta(hours=3)
    assert not Reservation.objects.exists()


def test_moving_a_booking_into_a_drain_is_refused(people, teams, t4, admin, booked, day):
    [booking] = booked(people["alice"], teams["vision"], day + timedelta(hours=5), 1)
    plan(t4, admin, day, day + timedelta(hours=3))
    with pytest.raises(services.BookingConflict, match="t4-node-1 is drained for maintenance"):
        services.move_booking(booking.pk, people["alice"], day + timedelta(hours=1), day + timedelta(hours=2))
    booking.refresh_from_db()
    assert booking.starts_at == day + timedelta(hours=5)


def test_a_drain_of_one_node_leaves_the_models_other_cards_bookable(people, teams, fleet, admin, booked, day):
    plan(Node.objects.get(name="a100-node-2"), admin, day, day + timedelta(hours=3))
    made = booked(people["alice"], teams["vision"], day, 1, gpu_model="A100-80GB", gpu_count=2)
    assert made[0].state == "booked"  # a100-node-1's 8 cards are enough


def test_planning_a_drain_over_bookings_is_refused_naming_them_unless_forced(
        people, teams, t4, admin, booked, day, django_capture_on_commit_callbacks):
    [booking] = booked(people["alice"], teams["vision"], day + timedelta(hours=1), 1, gpu_count=2)
    with pytest.raises(drain_effects.DrainBreaksBookings) as refused:
        plan(t4, admin, day, day + timedelta(hours=3))
    assert [r.pk for r in refused.value.bookings] == [booking.pk]
    assert f"#{booking.pk} of team vision (alice)" in str(refused.value)
    assert not PlannedDrain.objects.exists()
    assert not AuditEntry.objects.filter(action="drain planned").exists()

    with pytest.raises(drain_effects.DrainBreaksBookings):  # an open-ended drain breaks it too
        plan(t4, admin, day, None)

    with django_capture_on_commit_callbacks(execute=True):
        planned = plan(t4, admin, day, day + timedelta(hours=3), force=True)
    entry = AuditEntry.objects.get(action="drain planned")
    assert entry.after["bookings_affected"][0]["id"] == booking.pk and entry.actor_label == "admin"
    [notice] = Notification.objects.filter(user=people["alice"], event="drain")
    assert f"plan #{planned.pk}" in notice.text and "may not get its capacity" in notice.text
    booking.refresh_from_db()
    assert booking.state == "booked"  # kept: its owner decides


def test_a_drain_after_a_booking_ends_breaks_nothing(people, teams, t4, admin, booked, day):
    booked(people["alice"], teams["vision"], day, 1, gpu_count=2)
    planned = plan(t4, admin, day + timedelta(hours=1), day + timedelta(hours=2))
    assert planned.state == DrainState.PLANNED


def test_the_tick_drains_the_node_at_the_start_and_returns_it_at_the_end(people, t4, admin, day):
    planned = plan(t4, admin, day, day + timedelta(hours=2))
    assert fleet_services.apply_due_drains(now=day - timedelta(seconds=1)) == (0, 0)
    assert fleet_services.apply_due_drains(now=day + timedelta(seconds=10)) == (1, 0)
    t4.refresh_from_db()
    assert t4.status == NodeStatus.DRAINING and t4.status_reason.startswith("planned drain until")
    assert fleet_services.apply_due_drains(now=day + timedelta(seconds=20)) == (0, 0)  # once only
    assert fleet_services.apply_due_drains(now=day + timedelta(hours=2, seconds=10)) == (0, 1)
    t4.refresh_from_db()
    planned.refresh_from_db()
    assert t4.status == NodeStatus.READY and planned.state == DrainState.ENDED
    actions = list(AuditEntry.objects.filter(object_type="node").order_by("pk").values_list("action", flat=True))
    assert actions == ["drain planned", "drained", "undrained"]


def test_a_drain_a_site_admin_ended_by_hand_is_not_undone(people, t4, admin, day):
    planned = plan(t4, admin, day, day + timedelta(hours=2))
    fleet_services.apply_due_drains(now=day + timedelta(seconds=10))
    fleet_services.undrain(t4.pk, admin)
    planned.refresh_from_db()
    assert planned.state == DrainState.ENDED and "by hand by admin" in planned.end_note
    assert fleet_services.apply_due_drains(now=day + timedelta(minutes=30)) == (0, 0)
    t4.refresh_from_db()
    assert t4.status == NodeStatus.READY  # not drained again


def test_a_node_drained_by_hand_stays_drained_after_the_plan(people, t4, admin, day):
    planned = plan(t4, admin, day, day + timedelta(hours=2))
    fleet_services.drain(t4.pk, admin, "disk replaced, waiting for the vendor")
    fleet_services.apply_due_drains(now=day + timedelta(seconds=10))
    fleet_services.apply_due_drains(now=day + timedelta(hours=3))
    t4.refresh_from_db()
    planned.refresh_from_db()
    assert t4.status == NodeStatus.DRAINING and t4.status_reason == "disk replaced, waiting for the vendor"
    assert planned.state == DrainState.ENDED and not planned.applied


def test_a_drain_starting_now_drains_at_once_and_bookings_count_the_node_back_after_it(people, teams, t4, admin,
                                                                                         booked, day):
    now_plan = plan(t4, admin, timezone.now() - timedelta(minutes=1), day)  # a minute ago is now
    t4.refresh_from_db()
    assert t4.status == NodeStatus.DRAINING and now_plan.state == DrainState.ACTIVE
    assert booked(people["alice"], teams["vision"], day + timedelta(hours=1), 1)  # after its end: fits
    with pytest.raises(services.BookingConflict, match="drained for maintenance"):
        booked(people["alice"], teams["vision"], day - timedelta(hours=1), 2)


def test_cancelling_a_planned_drain_frees_its_window(people, teams, t4, admin, booked, day):
    planned = plan(t4, admin, day, day + timedelta(hours=3))
    fleet_services.cancel_drain(planned.pk, admin)
    planned.refresh_from_db()
    assert planned.state == DrainState.CANCELLED
    assert booked(people["alice"], teams["vision"], day + timedelta(hours=1), 1)
    assert AuditEntry.objects.filter(action="drain cancelled").exists()


def test_ending_an_active_drain_early_returns_the_node(people, t4, admin, day):
    planned = plan(t4, admin, timezone.now(), day)
    fleet_services.cancel_drain(planned.pk, admin)
    t4.refresh_from_db()
    planned.refresh_from_db()
    assert t4.status == NodeStatus.READY and planned.state == DrainState.ENDED
    assert planned.end_note == "ended early by admin"


def test_overlapping_plans_of_one_node_are_refused(people, t4, admin, day):
    plan(t4, admin, day, day + timedelta(hours=3))
    with pytest.raises(RuleViolation, match="overlaps the drain already planned"):
        plan(t4, admin, day + timedelta(hours=2), None)


@pytest.mark.parametrize(("start", "end", "reason", "field", "words"), [
    (-1, 2, "psu", "starts_at", "must be now or in the future"),
    (100 * 24, None, "psu", "starts_at", "at most 90 days ahead"),
    (2, 1, "psu", "ends_at", "at least a minute after the start"),
    (2, 2 + 31 * 24, "psu", "ends_at", "at most 30 days"),
    (2, 3, "   ", "reason", "say why"),
    (2, 3, "x" * 201, "reason", "keep it to 200"),
])
def test_a_bad_plan_is_refused_by_field(db, day, start, end, reason, field, words):
    now = timezone.now()
    with pytest.raises(RuleViolation) as refused:
        drain_plans.window_of(now + timedelta(hours=start), None if end is None else now + timedelta(hours=end),
                              reason)
    assert words in " ".join(refused.value.errors[field])


def test_the_bookings_beat_drains_the_node_within_its_tick(people, t4, admin, day):
    from portal.placement import bookings
    from tests.reservations import clock_at

    plan(t4, admin, day, day + timedelta(hours=1))
    with clock_at(day + timedelta(seconds=5)):
        assert bookings.tick()["drains_started"] == 1
    t4.refresh_from_db()
    assert t4.status == NodeStatus.DRAINING
    with clock_at(day + timedelta(hours=1, seconds=5)):
        assert bookings.tick()["drains_ended"] == 1
    t4.refresh_from_db()
    assert t4.status == NodeStatus.READY


def test_a_node_lost_during_its_drain_comes_back_drained_and_is_returned_at_the_end(people, t4, admin, day):
    from portal.fleet.models import LostCause

    plan(t4, admin, day, day + timedelta(hours=2))
    fleet_services.apply_due_drains(now=day + timedelta(seconds=10))
    fleet_services.mark_lost(t4.pk, LostCause.AGENT_SILENT, "no agent report for 60 s")
    fleet_services.mark_back(t4.pk)
    t4.refresh_from_db()
    assert t4.status == NodeStatus.DRAINING and t4.status_reason.startswith("planned drain until")
    fleet_services.apply_due_drains(now=day + timedelta(hours=2, seconds=10))
    t4.refresh_from_db()
    assert t4.status == NodeStatus.READY
