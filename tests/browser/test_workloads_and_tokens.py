"""In Chromium: carol (vision's team admin) filters, sorts, exports and acts on her team's
workloads; dave (its manager) only looks; alice makes, uses and revokes an API token. Screenshots at
desktop width and 390 px go to /tmp/shots-workloads/."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from portal.fleet import inventory
from portal.reservations.models import Reservation
from portal.tenancy.models import Membership, Role
from tests.reservations import clock_at, submitted
from tests.teams import make_team

from .stack import sign_in

pytestmark = pytest.mark.browser
SHOTS = Path("/tmp/shots-workloads")
DEMO = Path(__file__).resolve().parents[2] / "deploy" / "inventory" / "demo.yaml"


@pytest.fixture
def world(chromium, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(DEMO)
    vision = make_team("vision", "Vision", quota_gpu_share=4)
    nlp = make_team("nlp", "NLP", quota_gpu_share=4)
    users = {}
    for name, team, role in (("carol", vision, Role.ADMIN), ("dave", vision, Role.MANAGER),
                             ("alice", vision, Role.MEMBER), ("bob", nlp, Role.MEMBER)):
        users[name] = get_user_model().objects.create_user(name, password=f"s3cret-{name}")
        Membership.objects.create(user=users[name], team=team, role=role)
    now = timezone.now()
    made = {}
    for i, (who, team, share) in enumerate((("alice", vision, "0.25"), ("carol", vision, "0.5"),
                                            ("alice", vision, "0.75"), ("bob", nlp, "0.5"))):
        with clock_at(now - timedelta(hours=4 - i)):
            made[f"{who}-{share}"] = submitted(users[who], team, name=f"job-{who}-{i}", image="busybox:1",
                                               gpu_request=share, gpu_memory_mib=1024, max_duration_s=7200)
    return made


def shoot(page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def watch_errors(page) -> list[str]:
    """Script errors and Content-Security-Policy violations the page reports."""
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: seen.append(f"page error: {e}"))
    return seen


def rows(page) -> list[str]:
    return page.locator("table.workloads tbody tr td:nth-child(3)").all_inner_texts()


def test_team_admin_filters_sorts_exports_and_cancels_workloads(page, live_server, world):
    base = live_server.url
    errors = watch_errors(page)
    page.on("dialog", lambda d: d.accept())
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, base, "carol", "s3cret-carol")
    page.click("nav >> text=Workloads")
    page.wait_for_url(f"{base}/workloads/")
    assert sorted(rows(page)) == ["alice", "alice", "carol"]  # vision's, not bob's
    assert "job-bob" not in page.content()

    page.fill("#w-user", "alice")
    page.wait_for_url(re.compile(r"user=alice"), wait_until="commit")
    page.wait_for_function("document.querySelectorAll('table.workloads tbody tr').length === 2")
    assert rows(page) == ["alice", "alice"]

    page.click("table.workloads th >> text=Share")
    page.wait_for_url(re.compile(r"sort=share"), wait_until="commit")
    page.wait_for_selector("th[aria-sort=ascending] >> text=Share")
    shares = page.locator("table.workloads tbody td:nth-child(8)").all_inner_texts()
    assert shares == ["25 %", "75 %"]
    page.click("table.workloads th >> text=Share")
    page.wait_for_selector("th[aria-sort=descending] >> text=Share")
    assert page.locator("table.workloads tbody td:nth-child(8)").all_inner_texts() == ["75 %", "25 %"]
    shoot(page, "workloads-desktop")

    # A backwards range: said in words, both dates still there.
    page.fill("#w-since", "2026-11-05")
    page.fill("#w-until", "2026-11-01")
    page.dispatch_event("#w-until", "change")
    alert = page.locator("[data-error=until]")
    alert.wait_for()
    assert "the end date 2026-11-01 is before the start date 2026-11-05" in alert.inner_text()
    assert page.input_value("#w-since") == "2026-11-05" and page.input_value("#w-until") == "2026-11-01"
    shoot(page, "workloads-backwards-dates")
    page.fill("#w-since", "")
    page.fill("#w-until", "")
    page.dispatch_event("#w-until", "change")
    page.wait_for_selector("table.workloads")

    with page.expect_download() as download:
        page.click("text=Download CSV")
    table = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert table[0][:6] == ["id", "team", "user", "name", "state", "GPU model"]
    assert [line[2] for line in table[1:]] == ["alice", "alice"] and [line[6] for line in table[1:]] == ["75.0", "25.0"]

    target = world["alice-0.75"]
    row = page.locator(f"tr[data-reservation='{target.pk}']")
    row.locator("summary").click()
    shoot(page, "workloads-actions")
    row.locator("button:has-text('Cancel')").click()
    page.wait_for_selector(f"text=Reservation {target.pk} cancelled.")
    assert "user=alice" in page.url and "sort=-share" in page.url  # back where she was
    assert Reservation.objects.get(pk=target.pk).state == "cancelled"

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{base}/workloads/")
    shoot(page, "workloads-390")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert errors == []


def test_manager_looks_but_cannot_act(page, live_server, world):
    base = live_server.url
    sign_in(page, base, "dave", "s3cret-dave")
    page.goto(f"{base}/workloads/")
    assert len(rows(page)) == 3 and page.locator("summary:has-text('Actions')").count() == 0
    target = world["alice-0.25"]
    token = page.evaluate("document.body.getAttribute('hx-headers')")
    csrf = re.search(r'"X-CSRFToken": "([^"]+)"', token).group(1)
    answer = page.request.post(f"{base}/workloads/{target.pk}/cancel/", headers={"X-CSRFToken": csrf})
    assert answer.status == 403
    assert page.request.post(f"{base}/workloads/{world['bob-0.5'].pk}/cancel/",
                             headers={"X-CSRFToken": csrf}).status == 404
    assert Reservation.objects.get(pk=target.pk).state != "cancelled"


def test_alice_makes_uses_and_revokes_a_token(page, live_server, world):
    base = live_server.url
    errors = watch_errors(page)
    page.on("dialog", lambda d: d.accept())
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, base, "alice", "s3cret-alice")
    page.click("nav >> text=API tokens")
    page.wait_for_url(f"{base}/tokens/")
    page.fill("#t-name", "laptop")
    page.click("button:has-text('Make token')")
    key = page.input_value("#new-key")
    assert len(key) > 30
    shoot(page, "tokens-made-desktop")
    answer = page.request.get(f"{base}/api/v1/teams/", headers={"Authorization": f"Token {key}"})
    assert answer.status == 200

    page.goto(f"{base}/tokens/")
    assert page.locator("#new-key").count() == 0 and key not in page.content()  # shown once
    row = page.locator("tr[data-token=laptop]")
    assert key[:8] in row.inner_text() and "never" not in row.inner_text()  # last used: just now

    page.fill("#t-name", "laptop")
    page.click("button:has-text('Make token')")
    assert "You already have a token named 'laptop'" in page.locator("#t-name-error").inner_text()
    assert page.locator("#new-key").count() == 0
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shoot(page, "tokens-390")

    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{base}/tokens/")
    page.locator("tr[data-token=laptop] button:has-text('Revoke')").click()
    page.wait_for_selector("text=You have no live token.")
    answer = page.request.get(f"{base}/api/v1/teams/", headers={"Authorization": f"Token {key}"})
    assert answer.status == 401
    assert errors == []
