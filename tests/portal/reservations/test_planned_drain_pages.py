"""Planned drains on the pages: the node's drains page (plan, refused over bookings until "plan it
anyway", cancel), the fleet row naming the plan, and the calendar's dips for managers only."""

from __future__ import annotations

from datetime import timedelta

import pytest

from portal.fleet.models import DrainState, PlannedDrain
from portal.notifications.models import Notification

PAGE = "/fleet/nodes/t4-node-1/drains/"


def _local(at) -> str:
    return at.strftime("%Y-%m-%dT%H:%M")


@pytest.fixture
def admin(browser_for, fleet):
    return browser_for("admin")


def test_a_site_admin_plans_a_drain_and_sees_it_on_the_fleet_and_the_calendar(admin, browser_for, day):
    r = admin.post(PAGE, {"starts_at": _local(day), "ends_at": _local(day + timedelta(hours=3)),
                          "reason": "firmware update"}, follow=True)
    assert r.status_code == 200
    text = r.content.decode()
    assert "Drain of t4-node-1 planned" in text and "firmware update" in text
    assert "Planned drain: " in admin.get("/fleet/?node=t4-node-1").content.decode()
    calendar = admin.get("/bookings/").content.decode()
    assert "Planned drains" in calendar and "0 / 2" in calendar and "firmware update" in calendar
    assert "firmware update" in browser_for("dave").get("/bookings/").content.decode()  # a manager
    assert "Planned drains" not in browser_for("alice").get("/bookings/").content.decode()  # a member


def test_a_member_cannot_open_the_drains_page(browser_for, fleet, day):
    alice = browser_for("alice")
    assert alice.get(PAGE).status_code == 403
    assert alice.post(PAGE, {"starts_at": _local(day), "reason": "x"}).status_code == 403
    assert not PlannedDrain.objects.exists()


def test_a_drain_over_a_booking_is_refused_until_planned_anyway(admin, people, teams, booked, day,
                                                                 django_capture_on_commit_callbacks):
    [booking] = booked(people["alice"], teams["vision"], day + timedelta(hours=1), 1, gpu_count=2)
    form = {"starts_at": _local(day), "ends_at": _local(day + timedelta(hours=3)), "reason": "rack move"}
    r = admin.post(PAGE, form)
    assert r.status_code == 400
    assert f"#{booking.pk}" in r.content.decode() and "Plan it anyway" in r.content.decode()
    assert not PlannedDrain.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(PAGE, form | {"force": "on"})
    assert PlannedDrain.objects.get().reason == "rack move"
    assert Notification.objects.filter(user=people["alice"], event="drain").exists()


def test_bad_input_is_shown_on_its_field(admin, day):
    r = admin.post(PAGE, {"starts_at": _local(day), "ends_at": _local(day - timedelta(hours=1)), "reason": "psu"})
    assert r.status_code == 400 and "must be at least a minute after the start" in r.content.decode()


def test_cancelling_from_the_page(admin, day):
    admin.post(PAGE, {"starts_at": _local(day), "reason": "psu"})
    plan = PlannedDrain.objects.get()
    r = admin.post(f"{PAGE}{plan.pk}/cancel/", follow=True)
    assert "is cancelled" in r.content.decode()
    plan.refresh_from_db()
    assert plan.state == DrainState.CANCELLED
