"""A data scientist sees the bell in the header count up when their reservation starts running (no
reload: the worker's notification reaches the page over ws/live/), reads the notification, opens
the reservation from it, and chooses what they are told. Against the whole stack (Daphne, a Celery
worker and beat on Redis, PostgreSQL)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.reservations import rules, services
from portal.tenancy.models import Membership, Role
from tests.integration.conftest import INVENTORY
from tests.teams import make_team
from tests.waiting import until

from .stack import shoot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]




def bell(page) -> int:
    return int(page.get_attribute("[data-bell]", "data-unread") or 0)


def test_the_bell_counts_up_when_the_reservation_runs(chromium, stack, tmp_path):
    portal, worker = stack["portal"], stack["worker"]
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(2), quota_memory_mib=200_000, quota_max_gpus=4)
    alice = get_user_model().objects.create_user("alice", password="alice-pw", email="alice@example.com")
    Membership.objects.create(user=alice, team=vision, role=Role.MEMBER)
    # The demo's mail: files here (the worker writes them, the portal's mailbox page reads them).
    demo_mail = {"TESSERA_DEMO": "1", "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
                 "EMAIL_FILE_PATH": str(tmp_path / "mail")}
    worker.env.update(demo_mail)
    portal.stop()
    portal.env.update(demo_mail)
    portal.start()

    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, portal.url, "alice", "alice-pw")
    assert bell(page) == 0 and page.locator("[data-bell-count]").is_hidden()
    r = services.submit(alice, rules.ReservationSpec(team=vision, image="img", name="train-resnet",
                                                     gpu_model="T4", gpu_request=Decimal("0.5"),
                                                     gpu_memory_mib=4096, max_duration_s=7200))
    page.wait_for_selector("html[data-live=open]", state="attached")
    page.wait_for_timeout(500)  # the bell's subscription answered (its state re-read once)
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    worker.start()  # the cycle places it, the pod watch sees it run, the notification follows
    until(page, lambda: bell(page) == 1, "the bell to count the running reservation")
    assert navigations == []  # no reload
    assert page.locator("[data-bell-count]").inner_text() == "1"
    assert page.get_attribute("[data-bell]", "aria-label") == "Notifications: 1 unread"
    shoot(page, "notifications-bell")

    page.click("[data-bell]")
    page.wait_for_url(f"{portal.url}/notifications/")
    note = page.locator(".note.is-unread")
    assert note.count() == 1
    assert "Your reservation 'train-resnet' (0.5 of a T4) is running on t4-node-1." in note.inner_text()
    shoot(page, "notifications-list", dark=True)
    note.locator("button[name=open]").click()
    page.wait_for_url(f"{portal.url}/reservations/{r.pk}/")
    assert bell(page) == 0 and page.locator("[data-bell-count]").is_hidden()
    page.goto(f"{portal.url}/notifications/")
    assert page.locator(".note.is-unread").count() == 0 and page.locator(".note").count() == 1

    # What she is told, and how: the page refuses a minute count of 0 in words.
    page.click("text=Choose what you are told")
    page.wait_for_url(f"{portal.url}/notifications/settings/")
    assert page.is_checked("input[name=running__email]") and not page.is_checked("input[name=idle__email]")
    page.fill("input[name=waiting_after_min]", "0")
    page.click("button:has-text('Save')")
    assert "Wait at least 1 minute before you are told." in page.inner_text("main")
    shoot(page, "notifications-settings")
    page.fill("input[name=waiting_after_min]", "30")
    page.uncheck("input[name=finished__email]")
    page.click("button:has-text('Save')")
    page.wait_for_url(re.compile(r"/notifications/settings/$"))
    assert "Saved" in page.inner_text("#toasts")
    assert not page.is_checked("input[name=finished__email]")
    assert page.input_value("input[name=waiting_after_min]") == "30"
    # The e-mail went out from the worker; the demo's mailbox shows it to her.
    until(page, lambda: any((tmp_path / "mail").glob("*.log")), "the running mail")
    page.goto(f"{portal.url}/notifications/mail/")
    assert "[Tessera] 'train-resnet' is running" in page.inner_text("main")
    assert f"/reservations/{r.pk}/" in page.inner_text("main")
    shoot(page, "notifications-mailbox")
    assert errors == []
    context.close()
