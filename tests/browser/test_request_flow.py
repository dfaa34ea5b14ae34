"""A data scientist signs in, requests a GPU share, sees it listed and cancels it — in a real browser."""

import os

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.reservations.models import Reservation
from portal.tenancy.models import Membership, Role, Team


@pytest.fixture
def world(chromium, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "inventory", "demo.yaml"))
    team = Team.objects.create(slug="vision", name="Vision", quota_gpu_share=2)
    alice = get_user_model().objects.create_user("alice", password="s3cret-alice")
    Membership.objects.create(user=alice, team=team, role=Role.MEMBER)
    return team


def sign_in(page, base, username, password):
    page.goto(f"{base}/")
    assert "/login/" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def test_request_list_and_cancel(page, live_server, world):
    sign_in(page, live_server.url, "alice", "s3cret-alice")
    page.click("text=Request GPU")
    page.select_option("#id_team", "vision")
    page.fill("#id_gpu_request", "0.4")
    page.fill("#id_gpu_limit", "0.8")
    page.fill("#id_gpu_memory_mib", "12288")
    page.select_option("#id_gpu_model", "A100-80GB")
    page.click("button:has-text('Submit')")
    page.wait_for_selector("text=submitted")
    row = Reservation.objects.get()
    line = page.locator(f"tr[data-reservation='{row.pk}']")
    # Without Redis the placement cycle runs in-process on submit, so it may already be placed.
    text = line.inner_text()
    assert ("pending" in text or "placed" in text or "running" in text) and "0.400–0.800" in text

    line.locator("button:has-text('Cancel')").click()
    page.wait_for_selector("text=cancelled.")
    assert "cancelled" in page.locator(f"tr[data-reservation='{row.pk}']").inner_text()
    row.refresh_from_db()
    assert row.state == "cancelled"


def test_form_errors_are_shown_next_to_fields(page, live_server, world):
    sign_in(page, live_server.url, "alice", "s3cret-alice")
    page.goto(f"{live_server.url}/reservations/new/")
    page.fill("#id_gpu_request", "0.6")
    page.fill("#id_gpu_limit", "0.3")
    page.click("button:has-text('Submit')")
    alerts = page.locator("[role=alert]").all_inner_texts()
    assert alerts == ["must be between gpu_request (0.600) and 1.0"], alerts
    assert not Reservation.objects.exists()


def test_wrong_password_stays_on_login(page, live_server, world):
    sign_in(page, live_server.url, "alice", "wrong")
    assert "/login/" in page.url
    assert page.locator(".error").count() == 1
