"""The fleet view left open in a site admin's browser follows the fleet by push (ws/live/, the
`fleet` group), on the whole stack: a node drained by another admin, a node whose agent falls
silent marked lost, and a share the placement worker puts on a GPU all show within seconds,
without a reload. Cordoning a GPU from the page asks for a reason, which the page then shows; an
idle reservation's page says when the team's policy reclaims it. A page filtered to ready nodes
lets a node go once it is drained."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.fleet import inventory
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, LostCause, Node
from portal.reservations import rules, services
from portal.reservations.models import Reservation
from portal.tenancy import policy
from portal.tenancy.models import Membership, Role
from tests.integration.conftest import INVENTORY
from tests.teams import make_team
from tests.waiting import wait_for

from .stack import shoot, sign_in
from .test_admin_flows import new_page

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

SOON_MS = 5_000  # "within a few seconds": a push, not the page's old 30 s refresh


def test_the_fleet_page_follows_drains_losses_and_new_shares_without_reload(chromium, stack):
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(3), quota_memory_mib=300_000,
                                 quota_max_gpus=6)
    users = get_user_model().objects
    admin_user = users.create_user("admin", password="admin-pw", is_staff=True)
    alice = users.create_user("alice", password="alice-pw")
    Membership.objects.create(user=alice, team=vision, role=Role.MEMBER)
    errors: list[str] = []
    admin = new_page(chromium, errors)
    sign_in(admin, stack["portal"].url, "admin", "admin-pw")
    loads: list[str] = []
    admin.on("framenavigated", lambda frame: loads.append(frame.url) if frame == admin.main_frame else None)
    admin.goto(f"{stack['portal'].url}/fleet/")
    admin.locator("html[data-live=open]").wait_for()
    loads.clear()

    # another admin drains a node; an agent-silent node is marked lost (fleet.services, their writer)
    a100, t4 = Node.objects.get(name="a100-node-1"), Node.objects.get(name="t4-node-1")
    fleet_services.drain(a100.pk, audit.api(admin_user), "disk swap")
    expect(admin.locator("li[data-node=a100-node-1] [data-node-state]")).to_have_text("draining", timeout=SOON_MS)
    expect(admin.locator("li[data-node=a100-node-1]")).to_contain_text("disk swap")
    fleet_services.mark_lost(t4.pk, LostCause.AGENT_SILENT, "no agent report for 30 s")
    expect(admin.locator("li[data-node=t4-node-1] [data-node-state]")).to_have_text("lost", timeout=SOON_MS)
    expect(admin.locator("#fleet-summary")).to_contain_text("1 draining, 1 lost")

    # alice asks for a share; the worker places it on a ready node; its slice appears on the page
    reservation = services.submit(alice, rules.ReservationSpec(team=vision, image="busybox:1.36",
                                                               gpu_request=Decimal("0.25"), gpu_memory_mib=2048))
    stack["worker"].start()
    wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state in ("placed", "running"), 60, "placed")
    gpu = Gpu.objects.get(allocations__reservation=reservation, allocations__released_at__isnull=True)
    assert gpu.node.name not in ("a100-node-1", "t4-node-1")
    expect(admin.locator(f"li[data-gpu='{gpu.pk}'] a[data-reservation='{reservation.pk}']")).to_have_count(
        1, timeout=SOON_MS)
    assert loads == [], loads  # every change came by push: the page was never loaded again
    shoot(admin, "fleet-live")

    # cordon a GPU from the page: the confirmation asks for a reason, which is audited and shown
    free = Gpu.objects.filter(node__name=gpu.node.name).exclude(pk=gpu.pk).order_by("index").first()
    admin.click(f"li[data-gpu='{free.pk}'] button[data-cordon='1']")
    dialog = admin.locator("#cordon-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Cordon GPU {free.index} on {gpu.node.name}")
    dialog.locator("button[data-verb]").click()  # no reason: the browser asks for one first
    expect(dialog).to_be_visible()
    dialog.locator("input[name=reason]").fill("fan noise, ticket 4411")
    shoot(admin, "fleet-cordon-dialog")
    dialog.locator("button[data-verb]").click()
    admin.wait_for_selector(f"text=GPU {free.index} on {gpu.node.name} is cordoned")
    expect(admin.locator(f"li[data-gpu='{free.pk}'] .cordon-reason")).to_have_text("fan noise, ticket 4411")
    entry = AuditEntry.objects.get(object_type="gpu", object_id=free.pk)
    assert entry.after["cordon_reason"] == "fan noise, ticket 4411" and entry.via == "web"

    # a page filtered to ready nodes lets a node go when it is drained: off the list, said once
    other = Node.objects.filter(status="ready").exclude(pk=gpu.node_id).order_by("name").first()
    admin.goto(f"{stack['portal'].url}/fleet/?state=ready")
    admin.locator("html[data-live=open]").wait_for()
    expect(admin.locator(f"li[data-node='{other.name}']")).to_have_count(1)
    fleet_services.drain(other.pk, audit.api(admin_user), "firmware update")
    expect(admin.locator(f"li[data-node='{other.name}']")).to_have_count(0, timeout=SOON_MS)
    expect(admin.locator("#toasts")).to_contain_text(f"{other.name} no longer matches the filters.")
    expect(admin.locator(f"li[data-node='{gpu.node.name}']")).to_have_count(1)

    # the team reclaims idle shares after a 20-minute warning: the reservation page says when
    policy.set_policy(vision, audit.web(admin_user), {"idle_reclaim": True, "idle_warning_s": 1200})
    wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state == "running", 60, "running")
    assert services.flag_idle(reservation.pk, True, timezone.now())
    admin.goto(f"{stack['portal'].url}/reservations/{reservation.pk}/")
    expect(admin.locator(".idle-notice")).to_contain_text("It is reclaimed in 19 min")
    shoot(admin, "reservation-idle")
    admin.goto(f"{stack['portal'].url}/fleet/teams/vision/")
    expect(admin.locator("#id_limit_idle_warning_min")).to_have_value("")
    shoot(admin, "fleet-team-limits")
    assert not errors, errors
