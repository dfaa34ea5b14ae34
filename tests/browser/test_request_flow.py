"""The request form and the reservation page in a real browser on the in-process live server (no
Redis: the placement cycle runs in-process on submit): submit in human units, land on the
reservation's page, cancel it after confirming; errors next to the fields, in the user's words."""

import os

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.reservations.models import Reservation
from portal.tenancy.models import Membership, Role
from tests.teams import make_team

pytestmark = pytest.mark.browser


@pytest.fixture
def world(chromium, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "inventory", "demo.yaml"))
    team = make_team("vision", "Vision", quota_gpu_share=2)
    alice = get_user_model().objects.create_user("alice", password="s3cret-alice")
    Membership.objects.create(user=alice, team=team, role=Role.MEMBER)
    return team


def sign_in(page, base, username, password):
    page.goto(f"{base}/")
    assert "/login/" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def test_request_see_and_cancel(page, live_server, world):
    sign_in(page, live_server.url, "alice", "s3cret-alice")
    page.click("nav >> text=Request GPU")
    page.select_option("#id_team", "vision")
    page.fill("#id_gpu_request", "0.4")
    page.fill("#id_gpu_limit", "0.8")
    page.fill("#id_memory_gib", "12")
    page.select_option("#id_gpu_model", "A100-80GB")
    page.click("button:has-text('Submit request')")
    page.wait_for_selector("text=submitted")
    row = Reservation.objects.get()
    assert page.url.endswith(f"/reservations/{row.pk}/")
    assert (row.gpu_memory_mib, str(row.gpu_request), str(row.gpu_limit)) == (12288, "0.400", "0.800")
    assert "0.4 – 0.8" in page.inner_text("#summary") and "12 GiB" in page.inner_text("#summary")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Cancel reservation')")
    page.wait_for_selector("text=cancelled.")
    row.refresh_from_db()
    assert row.state == "cancelled"
    page.goto(f"{live_server.url}/")
    assert "cancelled" in page.inner_text("table")


def test_form_errors_are_shown_next_to_fields(page, live_server, world):
    sign_in(page, live_server.url, "alice", "s3cret-alice")
    page.goto(f"{live_server.url}/reservations/new/")
    page.fill("#id_gpu_request", "0.6")
    page.fill("#id_gpu_limit", "0.3")
    page.click("button:has-text('Submit request')")
    alerts = page.locator("form [role=alert]").all_inner_texts()
    assert alerts == ["The limit can't be below the share you ask for (0.6)."], alerts
    assert page.get_attribute("#id_gpu_limit", "aria-invalid") == "true"
    assert not Reservation.objects.exists()


def test_wrong_password_stays_on_login(page, live_server, world):
    sign_in(page, live_server.url, "alice", "wrong")
    assert "/login/" in page.url
    assert page.locator(".error").count() == 1
