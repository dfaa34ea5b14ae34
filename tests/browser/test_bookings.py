"""Bookings in a real browser against Daphne and PostgreSQL: alice books a T4 ahead from the
request page; bob's overlapping window is refused with what is taken and the nearest free windows,
one click on a window fills the form, and the booking goes through; both see their calendar, the
site admin the booked capacity per model; alice moves and cancels hers from the calendar.

The request page's booking part and the calendar are photographed at 1280 px and 390 px (a phone)
into $TESSERA_SHOTS (default /tmp/shots), and neither may scroll sideways at either width."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy.models import Membership, Role
from tests.integration.conftest import INVENTORY
from tests.teams import make_team

from .stack import sign_in
from .test_fairshare_pages import new_page, shoot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture
def org(stack):
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(2), quota_memory_mib=102400, quota_max_gpus=4)
    nlp = make_team("nlp", "NLP", quota_gpu_share=Decimal(2), quota_memory_mib=102400, quota_max_gpus=4)
    users = get_user_model().objects
    people = {name: users.create_user(name, password=f"{name}-pw") for name in ("alice", "bob")}
    people["admin"] = users.create_user("admin", password="admin-pw", is_staff=True)
    Membership.objects.create(user=people["alice"], team=vision, role=Role.MEMBER)
    Membership.objects.create(user=people["bob"], team=nlp, role=Role.MEMBER)
    return {"vision": vision, "nlp": nlp, **people}


def _local(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M")


def _book(page, base: str, start: datetime, hours: str, share: str, count: str = "1") -> None:
    page.goto(f"{base}/reservations/new/?book=1")
    page.fill("#id_image", "busybox:1.36")
    page.select_option("#id_gpu_model", "T4")
    page.fill("#id_gpu_count", count)
    page.fill("#id_gpu_request", share)
    page.fill("#id_memory_gib", "4")
    page.fill("#id_hours", hours)
    page.fill("#id_book_start", _local(start))


def test_book_ahead_see_a_conflict_pick_a_free_window_and_manage_it(chromium, stack, org):
    base = stack["portal"].url
    errors: list[str] = []
    day = datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0) + timedelta(days=2)

    alice = new_page(chromium, errors)
    sign_in(alice, base, "alice", "alice-pw")
    _book(alice, base, day, "2", "1", count="2")  # both T4s, 09:00–11:00
    alice.click("button:has-text('Submit request')")
    alice.wait_for_url(f"{base}/reservations/*/")
    assert "booked for" in alice.inner_text(".toasts")
    mine = Reservation.objects.get(owner=org["alice"])
    assert (mine.state, mine.starts_at, mine.ends_at) == (State.BOOKED, day, day + timedelta(hours=2))

    bob = new_page(chromium, errors)
    sign_in(bob, base, "bob", "bob-pw")
    _book(bob, base, day + timedelta(hours=1), "1", "0.5")
    bob.wait_for_selector("#preview [data-booking=no]")  # the preview already says the window is taken
    assert "T4 is fully booked" in bob.inner_text("#preview")
    bob.click("button:has-text('Submit request')")
    bob.wait_for_selector(".free-window")
    assert "T4 is fully booked for" in bob.inner_text("#request-form .error")
    windows = bob.locator(".free-window")
    assert windows.count() == 3
    shoot(bob, "bookings-request-conflict")
    windows.first.click()
    assert bob.input_value("#id_book_start") == _local(day + timedelta(hours=2))  # the hour after alice's
    assert bob.input_value("#id_book_end") == _local(day + timedelta(hours=3))
    bob.wait_for_selector("#preview [data-booking=yes]")
    shoot(bob, "bookings-request-free-window")
    bob.click("button:has-text('Submit request')")
    bob.wait_for_url(f"{base}/reservations/*/")
    theirs = Reservation.objects.get(owner=org["bob"])
    assert (theirs.state, theirs.starts_at) == (State.BOOKED, day + timedelta(hours=2))

    bob.click("nav >> text=Bookings")
    bob.wait_for_selector("#mine-title")
    assert bob.locator(".booking-cards").inner_text().count("T4") == 1
    assert "alice" not in bob.inner_text("main")

    admin = new_page(chromium, errors)
    sign_in(admin, base, "admin", "admin-pw")
    admin.goto(f"{base}/bookings/")
    assert "The whole fleet" in admin.inner_text("main")
    assert admin.locator("table.booked-days meter").count() == 1  # one day with bookings, T4
    assert admin.locator("table.booked-days meter").get_attribute("value") == "2"
    shoot(admin, "bookings-calendar-admin")

    alice.goto(f"{base}/bookings/")
    alice.click(".booking-actions summary")
    alice.fill(".move-booking input[name=start]", _local(day + timedelta(days=1)))
    alice.fill(".move-booking input[name=end]", _local(day + timedelta(days=1, hours=2)))
    shoot(alice, "bookings-calendar-member")
    alice.click(".move-booking button")
    alice.wait_for_selector(".toasts >> text=moved to")
    mine.refresh_from_db()
    assert mine.starts_at == day + timedelta(days=1)
    alice.click(".booking-actions button:has-text('Cancel')")  # the dialog is accepted
    alice.wait_for_selector(".toasts >> text=cancelled")
    mine.refresh_from_db()
    assert mine.state == State.CANCELLED
    assert errors == []
