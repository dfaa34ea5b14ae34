"""The server-rendered pages: sign in, request a share, see and cancel reservations."""

import pytest
from django.test import Client

from portal.reservations.models import Reservation


@pytest.fixture
def browser(people, fleet):
    client = Client()
    assert client.login(username="alice", password="pw-alice")
    return client


def test_pages_need_sign_in(db):
    r = Client().get("/")
    assert r.status_code == 302 and r["Location"].startswith("/login/")


def test_request_form_submits_and_lists(browser):
    page = browser.get("/reservations/new/")
    assert page.status_code == 200 and b"A100-80GB" in page.content
    r = browser.post("/reservations/new/", {"team": "vision", "kind": "interactive", "image": "jupyter/base-notebook:1",
                                            "gpu_request": "0.3", "gpu_memory_mib": "4096", "gpu_count": "1",
                                            "priority": "50"}, follow=True)
    assert r.status_code == 200
    row = Reservation.objects.get()
    assert row.owner.username == "alice" and str(row.gpu_request) == "0.300"
    assert f"Reservation {row.pk} submitted".encode() in r.content
    assert b"pending" in r.content


def test_form_shows_rule_and_quota_errors(browser):
    r = browser.post("/reservations/new/", {"team": "vision", "kind": "batch", "image": "busybox:1",
                                            "gpu_request": "0.5", "gpu_limit": "0.2", "gpu_memory_mib": "4096",
                                            "gpu_count": "1", "priority": "50"})
    assert b"must be between gpu_request" in r.content
    r = browser.post("/reservations/new/", {"team": "vision", "kind": "batch", "image": "busybox:1",
                                            "gpu_request": "1.0", "gpu_memory_mib": "4096",
                                            "gpu_count": "3", "priority": "50"})
    assert b"GPU share quota is 2.000" in r.content
    assert not Reservation.objects.exists()


def test_cancel_from_the_list(browser):
    browser.post("/reservations/new/", {"team": "vision", "kind": "batch", "image": "busybox:1",
                                        "gpu_request": "0.3", "gpu_memory_mib": "4096", "gpu_count": "1",
                                        "priority": "50"})
    row = Reservation.objects.get()
    r = browser.post(f"/reservations/{row.pk}/cancel/", follow=True)
    assert b"cancelled" in r.content
    row.refresh_from_db()
    assert row.state == "cancelled"


def test_other_teams_reservation_is_404(browser, people, teams):
    from portal.reservations import rules, services

    other = services.submit(people["bob"], rules.ReservationSpec(team=teams["nlp"], image="busybox:1",
                                                                 gpu_request=0.2, gpu_memory_mib=100))
    assert browser.post(f"/reservations/{other.pk}/cancel/").status_code == 404
    assert b"busybox" not in browser.get("/").content
