"""Planned drains in a real browser against Daphne and PostgreSQL: alice has booked both T4s; the
site admin opens "Plan drain" on t4-node-1 from the fleet page, is refused naming alice's booking,
plans it anyway, and sees the plan on the node's page, on the fleet row and as a dip on the
bookings calendar; then cancels it.

The node's drains page and the calendar are photographed at 1280 px and 390 px into
$TESSERA_SHOTS (default /tmp/shots), and neither may scroll sideways at either width."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from portal.fleet.models import DrainState, PlannedDrain
from portal.reservations import rules, services

from .stack import sign_in
from .test_bookings import org  # noqa: F401 (the fixture)
from .test_fairshare_pages import new_page, shoot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def _local(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M")


def test_plan_a_drain_over_a_booking_see_it_and_cancel_it(chromium, stack, org):  # noqa: F811
    base = stack["portal"].url
    errors: list[str] = []
    day = datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0) + timedelta(days=2)
    [booking] = services.book(org["alice"], rules.ReservationSpec(
        team=org["vision"], image="busybox:1.36", gpu_model="T4", gpu_count=2, gpu_request=1, gpu_memory_mib=4096),
        services.window_of(day + timedelta(hours=1), day + timedelta(hours=2)))

    admin = new_page(chromium, errors)
    sign_in(admin, base, "admin", "admin-pw")
    admin.goto(f"{base}/fleet/?node=t4-node-1")
    admin.click("li[data-node='t4-node-1'] >> text=Plan drain")
    admin.wait_for_selector("#plan-title")
    admin.fill("#id_starts_at", _local(day))
    admin.fill("#id_ends_at", _local(day + timedelta(hours=4)))
    admin.fill("#id_reason", "power supply replaced")
    admin.click("button:has-text('Plan the drain')")
    admin.wait_for_selector(".broken-bookings")
    assert f"#{booking.pk}" in admin.inner_text(".broken-bookings")
    assert "capacity promised to 1 booking(s)" in admin.inner_text("form .error")
    assert not PlannedDrain.objects.exists()
    shoot(admin, "drains-refused")
    admin.check("#id_force")
    admin.click("button:has-text('Plan the drain')")
    admin.wait_for_selector(".toasts >> text=were told")
    assert "power supply replaced" in admin.inner_text("table.drains")
    shoot(admin, "drains-node")

    admin.goto(f"{base}/fleet/?node=t4-node-1")
    assert "Planned drain:" in admin.inner_text("li[data-node='t4-node-1'] .node-drains")

    admin.goto(f"{base}/bookings/")
    dips = admin.locator("table.drain-dips")
    assert "t4-node-1" in dips.inner_text() and "0 / 2" in dips.inner_text()
    shoot(admin, "drains-calendar")

    admin.goto(f"{base}/fleet/nodes/t4-node-1/drains/")
    admin.click("table.drains button:has-text('Cancel')")  # the dialog is accepted
    admin.wait_for_selector(".toasts >> text=is cancelled")
    assert PlannedDrain.objects.get().state == DrainState.CANCELLED
    assert errors == []
