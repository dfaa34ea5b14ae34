"""Team admins and site admins in a real browser against the whole stack (Daphne, Celery worker
and beat on Redis, PostgreSQL, a simulated agent): carol runs team vision (members, an exclusion
group with its preview, the idle policy, a preset that alice then sees and uses); a request of
another group lands on another GPU, as the fleet view shows; the site admin drains a node from the
fleet view and new shares avoid it, rotates a node's agent token (the old one is refused by
ws/agents/) and reads all of it in the audit log. Dave and alice are offered none of these pages
and are refused them by URL."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from portal.audit.models import AuditEntry
from portal.fleet import inventory
from portal.fleet.models import Node
from portal.fleet.services import issue_node_token
from portal.reservations.models import Reservation
from portal.tenancy.models import Membership, Role
from tests.integration.conftest import INVENTORY
from tests.teams import make_team
from tests.waiting import wait_for

from .stack import shoot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]


@pytest.fixture
def org(stack):
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(3), quota_memory_mib=300_000,
                                 quota_max_gpus=6)
    nlp = make_team("nlp", "NLP", quota_gpu_share=Decimal(3), quota_memory_mib=300_000,
                              quota_max_gpus=6)
    users = get_user_model().objects
    people = {name: users.create_user(name, password=f"{name}-pw", email=f"{name}@example.com")
              for name in ("alice", "bob", "carol", "dave")}
    people["admin"] = users.create_user("admin", password="admin-pw", is_staff=True)
    for user, team, role in ((people["alice"], vision, Role.MEMBER), (people["bob"], nlp, Role.MEMBER),
                             (people["carol"], vision, Role.ADMIN), (people["dave"], vision, Role.MANAGER),
                             (people["dave"], nlp, Role.MANAGER)):
        Membership.objects.create(user=user, team=team, role=role)
    return {"vision": vision, "nlp": nlp, **people}


def new_page(chromium, errors: list):
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept())  # every confirmation is answered yes
    return page


def test_team_and_site_admins_in_the_browser(chromium, stack, org):
    base, worker = stack["portal"].url, stack["worker"]
    errors: list[str] = []

    # carol: members ----------------------------------------------------------------------------
    carol = new_page(chromium, errors)
    sign_in(carol, base, "carol", "carol-pw")
    carol.click("nav >> text=Team")
    carol.wait_for_url(f"{base}/team/vision/members/")
    carol.fill("#id_user", "bob@example.com")
    carol.select_option("#id_role", "member")
    carol.click("button:has-text('Add to vision')")
    carol.wait_for_selector("text=bob will see vision's reservations")
    assert carol.locator("tr[data-member=bob]").count() == 1
    carol.fill("#id_user", "bob")
    carol.click("button:has-text('Add to vision')")
    assert "bob is already in team vision (as member); change their role instead" in carol.inner_text("#user-error")
    shoot(carol, "team-members")
    carol.click("tr[data-member=bob] >> button:has-text('Remove')")
    carol.wait_for_selector("text=Removed bob")
    assert carol.locator("tr[data-member=bob]").count() == 0
    assert not Membership.objects.filter(user=org["bob"], team=org["vision"]).exists()

    # carol: an exclusion group, with its preview while typing --------------------------------------
    carol.click("nav.tabs >> text=Groups & labels")
    carol.fill("#id_label", "secret")
    carol.wait_for_selector("#preview >> text=can take a request in secret")
    carol.click("button:has-text('Create')")
    carol.wait_for_selector("tr[data-group=secret]")
    carol.fill("#id_label", "open")
    carol.wait_for_selector("#preview >> text=can take a request in open")
    shoot(carol, "team-groups")

    # carol: idle policy and a preset --------------------------------------------------------------
    carol.click("nav.tabs >> text=Policy")
    carol.fill("#id_idle_threshold_pct", "10")
    carol.fill("#id_idle_after_min", "20")
    carol.check("input[name=idle_action][value=warn]")
    carol.click("button:has-text('Save policy')")
    carol.wait_for_selector("text=Policy of team vision saved")
    org["vision"].refresh_from_db()
    assert (org["vision"].idle_threshold, org["vision"].idle_after_s, org["vision"].idle_reclaim) == \
        (Decimal("0.100"), 1200, False)
    shoot(carol, "team-policy")
    carol.click("nav.tabs >> text=Presets")
    carol.fill("#id_name", "Quick T4")
    carol.select_option("#id_gpu_model", "T4")
    carol.fill("#id_gpu_request", "0.5")
    carol.fill("#id_gpu_memory_mib", "4096")
    carol.fill("#id_image", "jupyter/base-notebook:2024")
    carol.click("button:has-text('Create preset')")
    carol.wait_for_selector("tr[data-preset='Quick T4']")
    shoot(carol, "team-presets")

    # alice sees the preset and requests into `secret` ------------------------------------------------
    alice = new_page(chromium, errors)
    sign_in(alice, base, "alice", "alice-pw")
    alice.click("nav >> text=Request GPU")
    preset = alice.locator("article.preset", has_text="Quick T4")
    assert preset.count() == 1
    preset.locator("a:has-text('Customise')").click()
    alice.wait_for_url(re.compile(r"preset="))
    alice.click("text=Advanced: priority")
    alice.select_option("#id_exclusion", "secret")
    alice.click("button:has-text('Submit request')")
    alice.wait_for_url(re.compile(r"/reservations/\d+/$"))
    secret = Reservation.objects.get(owner=org["alice"])
    assert secret.exclusion == "secret" and secret.gpu_model == "T4"

    # bob (nlp, no group) asks for the same kind of GPU --------------------------------------------------
    bob = new_page(chromium, errors)
    sign_in(bob, base, "bob", "bob-pw")
    bob.click("nav >> text=Request GPU")
    bob.select_option("#id_gpu_model", "T4")
    bob.fill("#id_gpu_request", "0.25")
    bob.fill("#id_memory_gib", "2")
    bob.click("button:has-text('Submit request')")
    bob.wait_for_url(re.compile(r"/reservations/\d+/$"))
    open_one = Reservation.objects.get(owner=org["bob"])
    worker.start()
    wait_for(lambda: all(r.state in ("placed", "running") for r in Reservation.objects.all()), 60,
             "both reservations placed")
    secret_gpu = secret.allocations.get().gpu
    open_gpu = open_one.allocations.get().gpu
    assert secret_gpu.node.name == open_gpu.node.name == "t4-node-1" and secret_gpu.pk != open_gpu.pk
    # carol's preview now names the GPU that holds `secret`, and her quota view shows alice's share
    carol.click("nav.tabs >> text=Groups & labels")
    carol.fill("#id_label", "open")
    carol.wait_for_selector(f"#preview >> text=GPU {secret_gpu.index} on t4-node-1 holds exclusion group secret; "
                            "a request in open cannot land there")
    carol.click("nav.tabs >> text=Quota")
    assert "alice" in carol.inner_text("main")
    shoot(carol, "team-quota")

    # the site admin: the fleet view shows both, on different GPUs ---------------------------------------
    admin = new_page(chromium, errors)
    sign_in(admin, base, "admin", "admin-pw")
    node = Node.objects.get(name="t4-node-1")
    old_token = issue_node_token(node)
    stack["agents"].start(node.name, old_token, interval=0.3)
    admin.click("nav >> text=Fleet")
    admin.wait_for_selector("li[data-node=t4-node-1]")
    t4 = admin.locator("li[data-node=t4-node-1]")
    assert t4.locator(f"li[data-gpu='{secret_gpu.pk}'] a[data-reservation='{secret.pk}']").count() == 1
    assert t4.locator(f"li[data-gpu='{open_gpu.pk}'] a[data-reservation='{open_one.pk}']").count() == 1
    # live utilization from the agent
    # (locators, not wait_for_function: the page's CSP forbids evaluating strings)
    admin.locator(f"li[data-gpu='{secret_gpu.pk}'][data-util-pct]").wait_for(timeout=60_000)
    shoot(admin, "fleet")
    admin.select_option("#f-model", "T4")
    expect(admin.locator("li[data-node]")).to_have_count(1)
    admin.select_option("#f-model", "")
    expect(admin.locator("li[data-node]")).to_have_count(4)

    # drain t4-node-1 from the fleet view: a new T4-or-V100 request avoids it ----------------------------
    t4.locator("button:has-text('Drain')").click()
    admin.wait_for_selector("text=Node t4-node-1 is draining")
    node.refresh_from_db()
    assert node.status == "draining"
    assert admin.inner_text("li[data-node=t4-node-1] [data-node-state]") == "draining"
    shoot(admin, "fleet-drained")
    bob.click("nav >> text=Request GPU")
    bob.select_option("#id_gpu_model", "")
    bob.fill("#id_gpu_request", "0.25")
    bob.fill("#id_memory_gib", "2")
    bob.click("button:has-text('Submit request')")
    bob.wait_for_url(re.compile(r"/reservations/\d+/$"))
    later = Reservation.objects.filter(owner=org["bob"]).order_by("-pk").first()
    wait_for(lambda: Reservation.objects.get(pk=later.pk).state in ("placed", "running"), 60, "placed")
    assert Reservation.objects.get(pk=later.pk).node.name != "t4-node-1"

    # rotate the node's token: the old one is refused at ws/agents/, the new one shown once works --------
    admin.goto(f"{base}/fleet/?node=t4-node-1")
    admin.click("li[data-node=t4-node-1] >> button:has-text('Rotate token')")
    admin.wait_for_selector("[data-token]")
    new_token = admin.input_value("[data-token]")
    shoot(admin, "fleet-token")
    headers = {"Authorization": f"Bearer {old_token}"}
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{stack['portal'].ws}/ws/agents/", additional_headers=headers, open_timeout=10)
    assert refused.value.response.status_code == 403
    with connect(f"{stack['portal'].ws}/ws/agents/", additional_headers={"Authorization": f"Bearer {new_token}"},
                 open_timeout=10):
        pass

    admin.click("nav >> text=Teams & quotas")
    admin.wait_for_selector("tr[data-team=vision]")
    shoot(admin, "fleet-teams")

    # the audit log has all of the above -----------------------------------------------------------------
    admin.click("nav >> text=Audit log")
    text = admin.inner_text("table.audit")
    for action, what in (("added", "bob in vision"), ("removed", "bob in vision"), ("created", "vision:secret"),
                         ("changed", "policy of vision"), ("created", "vision/Quick T4"), ("drained", "t4-node-1"),
                         ("rotated", "t4-node-1"), ("transition", f"reservation {secret.pk}")):
        assert f"{action} {what}" in text, (action, what)
    admin.select_option("#a-object", "node")
    admin.click("button:has-text('Filter')")
    admin.wait_for_url(re.compile(r"object=node"))
    assert admin.locator("table.audit tbody tr").count() == 1
    shoot(admin, "audit")
    assert {e.via for e in AuditEntry.objects.exclude(actor_label="system")} == {"web"}

    # carol reads her team's entries only; dave and alice are offered no admin page ---------------------
    carol.click("nav >> text=Audit log")
    mine = carol.inner_text("main")
    assert "created vision:secret" in mine and "drained t4-node-1" not in mine and "team nlp" not in mine
    shoot(carol, "audit-team-admin")
    for who in ("dave", "alice"):
        page = alice if who == "alice" else new_page(chromium, errors)
        if who == "dave":
            sign_in(page, base, "dave", "dave-pw")
        nav = page.inner_text("nav.nav")
        assert "Team" not in nav.split() and "Fleet" not in nav and "Audit" not in nav, (who, nav)
        for url in ("/team/vision/members/", "/team/vision/policy/", "/fleet/", "/fleet/teams/", "/audit/"):
            assert page.goto(f"{base}{url}").status == 403, (who, url)
        assert page.goto(f"{base}/team/nlp/members/").status in (403, 404)
    assert not errors, errors
