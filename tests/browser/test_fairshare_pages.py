"""Fair share in a real browser against Daphne (live pushes over Channels on Redis) and PostgreSQL,
the placement cycle deciding in this process: the site admin arranges the organisation and, when
he lowers research's quota below what its teams hold between them, is refused on the field with the
numbers and nothing is saved; alice sees how her reservations count (guaranteed, borrowed with her
team's warning, waiting with its place and reason) and, without reloading, her borrowed one being
reclaimed; carol reads her team's line and sets the warning; dave reads the report by department.

Every page changed for fair share is photographed at 1280 px and 390 px (a phone) into
$TESSERA_SHOTS (default /tmp/shots), and none may scroll sideways at either width."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from portal.audit import services as audit
from portal.fleet import inventory
from portal.reservations import services
from portal.reservations.models import Reservation
from portal.tenancy import departments, quotas
from portal.tenancy.models import Membership, Quota, Role, TeamPolicy
from tests.integration.conftest import INVENTORY
from tests.reservations import submitted
from tests.teams import make_team
from tests.waiting import until

from .stack import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
SHOTS = Path(os.environ.get("TESSERA_SHOTS", "/tmp/shots"))
BY = audit.cli("test")
A100 = "A100-80GB"


def shoot(page, name: str) -> None:
    """Full-length screenshots at desktop width and at 390 px; neither may overflow sideways."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    for label, width in (("desktop", 1280), ("390", 390)):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(350)  # charts redraw 150 ms after a resize
        page.screenshot(path=str(SHOTS / f"{name}-{label}.png"), full_page=True)
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= width, f"{name} scrolls sideways at {width} px ({wide} px wide)"
    page.set_viewport_size(size)




@pytest.fixture
def org(stack):
    """research (`*`: 4 GPUs of share) holds vision (`*` 1.0, borrowing at most 1.0 more) and nlp
    (`*` 2.0); a100-node-1's GPUs and the rest of the demo fleet."""
    inventory.load(INVENTORY)
    research = departments.create_department(BY, "research", "Research")
    departments.create_department(BY, "perception", "Perception", "research")
    quotas.replace_quotas(research, BY, [{"gpu_model": "*", "gpu_share": "4", "gpu_memory_gib": "400", "gpus": 8}])
    vision = make_team("vision", "Vision", department=research, quota_gpu_share=Decimal(1), quota_memory_mib=102400,
                       quota_max_gpus=4)
    nlp = make_team("nlp", "NLP", department=research, quota_gpu_share=Decimal(2), quota_memory_mib=102400,
                    quota_max_gpus=4)
    Quota.objects.filter(team=vision).update(borrow_gpu_share=Decimal(1))
    users = get_user_model().objects
    people = {name: users.create_user(name, password=f"{name}-pw") for name in ("alice", "bob", "carol", "dave")}
    people["admin"] = users.create_user("admin", password="admin-pw", is_staff=True)
    for user, team, role in ((people["alice"], vision, Role.MEMBER), (people["bob"], nlp, Role.MEMBER),
                             (people["carol"], vision, Role.ADMIN), (people["dave"], vision, Role.MANAGER),
                             (people["dave"], nlp, Role.MANAGER)):
        Membership.objects.create(user=user, team=team, role=role)
    return {"vision": vision, "nlp": nlp, "research": research, **people}


def request(org, who: str, team: str, share: str, **spec) -> Reservation:
    """Submitted as the API does; the placement cycle runs in this process when it commits."""
    r = submitted(org[who], org[team], image="busybox:1", gpu_request=Decimal(share), gpu_limit=Decimal(share),
                  gpu_memory_mib=4096, gpu_model=A100, **spec)
    return Reservation.objects.get(pk=r.pk)


def new_page(chromium, errors: list):
    page = chromium.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(30_000)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept())
    return page


def test_site_admin_is_refused_a_quota_its_teams_do_not_fit_in(chromium, stack, org):
    base = stack["portal"].url
    errors: list[str] = []
    request(org, "bob", "nlp", "1.0")
    request(org, "alice", "vision", "1.0")
    request(org, "alice", "vision", "0.5")  # beyond vision's 1.0: borrowed from nlp's unused quota
    admin = new_page(chromium, errors)
    sign_in(admin, base, "admin", "admin-pw")
    admin.click("nav >> text=Departments")
    admin.wait_for_selector("#department-research")
    assert admin.locator("#department-research #department-perception").count() == 1
    assert admin.locator("#department-research #team-vision").count() == 1
    admin.wait_for_selector("figure[data-bucket-chart][data-drawn=true]")
    vision = admin.locator("table.standing tr[data-unit=vision] .amt")
    assert vision.all_inner_texts() == ["1", "1.5", "0.5", "0"]  # quota, in use, borrowed, lent
    shoot(admin, "departments")

    # A department that would hold its teams at level 5 is refused on its own form.
    admin.click("#department-perception summary")
    admin.select_option("#parent-perception", "")
    admin.click("#department-perception button:has-text('Save')")
    admin.wait_for_url(f"{base}/fleet/departments/")
    assert "now under the organisation" in admin.inner_text("#toasts")

    # research's quota below what its teams' quotas add up to: refused, with the numbers, on the field.
    admin.click("#department-research a:has-text('Edit quotas')")
    admin.wait_for_url(f"{base}/fleet/departments/research/quotas/")
    shoot(admin, "quotas-department")
    admin.fill("#r0-gpu_share", "2.5")
    admin.click("button:has-text('Save quotas')")
    admin.wait_for_selector(".flash.error")
    summary = admin.inner_text(".flash.error")
    assert ("research's any-model (*) GPU share is 2.500; its children nlp 2.000 + vision 1.000 = 3.000 exceed it"
            in summary)
    assert admin.get_attribute("#r0-gpu_share", "aria-invalid") == "true"
    assert admin.inner_text("#r0-gpu_share-error") == "its units need 3.000 here (nlp 2.000 + vision 1.000)"
    assert admin.input_value("#r0-gpu_share") == "2.5"  # what was typed stays, to be corrected
    shoot(admin, "quotas-refused")
    assert Quota.objects.get(department=org["research"]).gpu_share == Decimal("4.000")

    # An A100 row beside `*`, saved.
    admin.fill("#r0-gpu_share", "4")
    admin.click("button:has-text('Add a model row')")
    admin.wait_for_selector("#r1-gpu_model")
    admin.select_option("#r1-gpu_model", A100)
    admin.fill("#r1-gpu_share", "2")
    admin.fill("#r1-gpu_memory_gib", "160")
    admin.fill("#r1-gpus", "2")
    admin.fill("#r1-lend_gpu_share", "1")
    admin.click("button:has-text('Save quotas')")
    admin.wait_for_selector("text=Quotas of department research saved")
    assert {q.gpu_model: q.lend_gpu_share for q in Quota.objects.filter(department=org["research"])} == {
        "*": None, A100: Decimal("1.000")}

    admin.click("nav >> text=Teams & quotas")
    admin.wait_for_selector("tr[data-team=vision]")
    shoot(admin, "fleet-teams")
    admin.click("tr[data-team=vision] a:has-text('Vision')")
    admin.wait_for_url(f"{base}/fleet/teams/vision/")
    shoot(admin, "fleet-team")
    admin.click("a:has-text('Edit quotas of vision')")
    admin.wait_for_url(f"{base}/fleet/teams/vision/quotas/")
    shoot(admin, "quotas-team")
    assert not errors, errors


def test_a_member_sees_how_her_reservations_count(chromium, stack, org):
    base = stack["portal"].url
    errors: list[str] = []
    guaranteed = request(org, "alice", "vision", "1.0")
    borrowed = request(org, "alice", "vision", "0.5")
    waiting = request(org, "alice", "vision", "1.0", name="big-run")
    assert (guaranteed.admission, borrowed.admission) == ("guaranteed", "borrowed")
    assert borrowed.state in ("placed", "running") and waiting.state == "pending"

    alice = new_page(chromium, errors)
    sign_in(alice, base, "alice", "alice-pw")
    card = alice.locator(f"#reservation-{borrowed.pk}")
    assert "may be reclaimed" in card.locator("[data-admission=borrowed]").inner_text()  # words for screen readers
    assert alice.locator(f"#reservation-{guaranteed.pk} [data-admission=guaranteed]").count() == 1
    assert alice.locator(f"#reservation-{waiting.pk} [data-admission]").count() == 0
    alice.wait_for_selector("html[data-live=open]", state="attached")
    shoot(alice, "home")

    alice.click(f"#reservation-{borrowed.pk} h3 a")
    alice.wait_for_url(f"{base}/reservations/{borrowed.pk}/")
    assert alice.inner_text("#counting-title") == "Borrowed — may be reclaimed with 5 min warning"
    assert alice.locator(".reclaim-notice").count() == 0
    alice.wait_for_selector("html[data-live=open]", state="attached")
    shoot(alice, "reservation-borrowed")

    # nlp wants its quota back: alice's page says so at once, prominently, and counts down.
    at = timezone.now() + timedelta(minutes=5)
    services.warn_reclaim(borrowed.pk, at, "team nlp needs its quota back: reclaimed after vision's 5 min warning")
    alice.wait_for_selector(".reclaim-notice [role=alert]", timeout=30_000)
    notice = alice.inner_text(".reclaim-notice")
    assert "Being reclaimed." in notice and at.strftime("%H:%M") in notice
    until(alice, lambda: re.search(r"\d+:\d\d left", alice.inner_text(".reclaim-notice .countdown") or ""),
          "the countdown")
    shoot(alice, "reservation-reclaimed")

    alice.goto(f"{base}/reservations/{waiting.pk}/")
    assert alice.inner_text("[data-queue-position] .stat-value") == "#1"
    estimate = alice.inner_text("[data-estimate] .stat-value")
    assert estimate == "No estimate" or re.match(r"in \d", estimate), estimate
    assert "borrowing limit" in alice.inner_text(".res-reason")
    shoot(alice, "reservation-waiting")

    alice.click("nav >> text=Request GPU")
    alice.select_option("#id_gpu_model", A100)
    alice.fill("#id_gpu_request", "0.25")
    alice.fill("#id_memory_gib", "4")
    alice.wait_for_selector("#preview .badge.tone-wait, #preview [data-admission]")
    shoot(alice, "request-preview")
    assert not errors, errors


def test_team_admin_and_manager_pages(chromium, stack, org):
    base = stack["portal"].url
    errors: list[str] = []
    request(org, "alice", "vision", "1.0")
    request(org, "alice", "vision", "0.5")
    carol = new_page(chromium, errors)
    sign_in(carol, base, "carol", "carol-pw")
    carol.goto(f"{base}/team/vision/quota/")
    line = carol.locator("tr[data-bucket='*'] .amt")
    assert line.all_inner_texts() == ["1", "1.5", "0.5", "0"]
    shoot(carol, "team-quota")
    carol.click("nav.tabs >> text=Policy")
    carol.fill("#id_reclaim_grace_min", "10")
    carol.click("button:has-text('Save policy')")
    carol.wait_for_selector("text=Policy of team vision saved")
    assert TeamPolicy.objects.get(team=org["vision"]).reclaim_grace_s == 600
    shoot(carol, "team-policy")
    assert carol.goto(f"{base}/team/nlp/quota/").status == 404  # another team's page

    # bob's nlp page: vision borrows from its unused quota now.
    nlp_admin = get_user_model().objects.create_user("erin", password="erin-pw")
    Membership.objects.create(user=nlp_admin, team=org["nlp"], role=Role.ADMIN)
    erin = new_page(chromium, errors)
    sign_in(erin, base, "erin", "erin-pw")
    erin.goto(f"{base}/team/nlp/quota/")
    assert erin.locator("tr[data-borrower=vision]").count() == 1
    shoot(erin, "team-quota-lender")

    dave = new_page(chromium, errors)
    sign_in(dave, base, "dave", "dave-pw")
    dave.goto(f"{base}/reports/?range=24h&group_by=department")
    dave.wait_for_selector("table[data-breakdown] tr[data-key=research]")
    shoot(dave, "report-department")
    dave.goto(f"{base}/reports/?range=24h")
    dave.wait_for_selector("table[data-breakdown] tr[data-key=vision]")
    shoot(dave, "report-team")
    assert not errors, errors
