"""Team-admin, fleet and audit pages: who may open them (others' teams 404, other roles 403),
what a form does, and that the fleet page's queries do not grow with the fleet."""

import gzip
import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.fleet import services as services_fleet
from portal.fleet.models import Gpu, Node
from portal.fleet.services import node_for_token
from portal.reservations import rules, services
from portal.tenancy.models import ExclusionGroup, Membership, Preset
from tests.reservations import placed
from tests.teams import set_any_quota

TEAM_TABS = ["members", "groups", "presets", "policy", "quota"]



@pytest.mark.parametrize("tab", TEAM_TABS)
@pytest.mark.parametrize(("who", "status"), [("carol", 200), ("admin", 200), ("alice", 403), ("dave", 403),
                                             ("bob", 404), ("erin", 404)])
def test_team_pages_only_for_the_teams_admins(fleet, browser_for, tab, who, status):
    assert browser_for(who).get(f"/team/vision/{tab}/").status_code == status


@pytest.mark.parametrize("url", ["/fleet/", "/fleet/teams/", "/fleet/teams/vision/"])
@pytest.mark.parametrize(("who", "status"), [("admin", 200), ("carol", 403), ("alice", 403), ("dave", 403)])
def test_fleet_pages_only_for_site_admins(fleet, browser_for, url, who, status):
    assert browser_for(who).get(url).status_code == status


@pytest.mark.parametrize(("who", "status"), [("admin", 200), ("carol", 200), ("alice", 403), ("dave", 403)])
def test_audit_page_for_site_and_team_admins(browser_for, who, status):
    assert browser_for(who).get("/audit/").status_code == status


def test_navigation_offers_only_what_the_role_may_use(browser_for):
    assert 'href="/team/"' not in browser_for("alice").get("/").content.decode()
    assert 'href="/fleet/"' not in browser_for("carol").get("/").content.decode()
    page = browser_for("admin").get("/").content.decode()
    assert 'href="/fleet/"' in page and 'href="/audit/"' in page


def test_actions_on_other_teams_objects_are_404(fleet, browser_for, teams, people):
    m = Membership.objects.get(user=people["bob"])
    assert browser_for("carol").post(f"/team/nlp/members/{m.pk}/remove/").status_code == 404
    assert browser_for("carol").post(f"/team/vision/members/{m.pk}/remove/").status_code == 404
    assert Membership.objects.filter(pk=m.pk).exists()
    x = ExclusionGroup.objects.get(team=teams["vision"])
    assert browser_for("erin").post(f"/team/vision/groups/exclusion/{x.pk}/delete/").status_code == 404
    assert browser_for("alice").post(f"/team/vision/groups/exclusion/{x.pk}/delete/").status_code == 403
    assert ExclusionGroup.objects.filter(pk=x.pk).exists()


def test_add_member_errors_say_what_to_do_and_write_nothing(browser_for):
    r = browser_for("carol").post("/team/vision/members/", {"user": "nobody", "role": "member"})
    assert r.status_code == 400 and "no user &#x27;nobody&#x27;" in r.content.decode()
    r = browser_for("carol").post("/team/vision/members/", {"user": "alice", "role": "member"})
    assert "alice is already in team vision (as member); change their role instead" in r.content.decode()
    r = browser_for("carol").post("/team/vision/members/", {"user": "bob", "role": "member"}, follow=True)
    assert "bob will see vision&#x27;s reservations" in r.content.decode()
    assert AuditEntry.objects.filter(via="web", action="added").count() == 1


def test_preset_form_and_policy_form(fleet, browser_for, teams):
    r = browser_for("carol").post("/team/vision/presets/", {
        "name": "Notebook", "kind": "interactive", "gpu_model": "T4", "gpu_request": "0.5", "gpu_limit": "",
        "gpu_memory_mib": "4096", "max_duration_h": "1.5", "image": "jupyter/base-notebook:latest", "command": ""})
    assert r.status_code == 302 and Preset.objects.get().gpu_limit == Decimal("0.500")
    assert Preset.objects.get().max_duration_s == 5400
    r = browser_for("carol").post("/team/vision/policy/", {
        "max_duration_h": "8", "interactive_max_h": "4", "idle_threshold_pct": "10", "idle_after_min": "15",
        "idle_action": "warn", "idle_warning_min": "20", "max_priority_member": "40", "max_priority_admin": "60",
        "allow_over_quota": "on"})
    assert r.status_code == 302
    teams["vision"].refresh_from_db()
    assert teams["vision"].idle_threshold == Decimal("0.100") and teams["vision"].idle_after_s == 900
    assert teams["vision"].idle_warning_s == 1200
    assert teams["vision"].idle_reclaim is False
    r = browser_for("carol").post("/team/vision/policy/", {
        "max_duration_h": "8", "interactive_max_h": "10", "idle_threshold_pct": "10", "idle_after_min": "15",
        "idle_action": "warn", "idle_warning_min": "20", "max_priority_member": "40", "max_priority_admin": "60"})
    assert r.status_code == 400 and "must not exceed the maximum duration" in r.content.decode()
    r = browser_for("carol").post("/team/vision/policy/", {
        "max_duration_h": "8", "interactive_max_h": "4", "idle_threshold_pct": "10", "idle_after_min": "15",
        "idle_action": "reclaim", "idle_warning_min": "", "max_priority_member": "40", "max_priority_admin": "60"})
    assert r.status_code == 400 and "a number of minutes, e.g. 15" in r.content.decode()


def test_the_reservation_page_says_when_an_idle_reservation_is_reclaimed(fleet, browser_for, teams, people):
    from django.db import transaction
    from django.utils import timezone

    from portal.reservations.states import State

    vision = teams["vision"]
    gpu = Gpu.objects.filter(node__name="t4-node-1").first()
    with transaction.atomic():
        r = services.submit(people["alice"], rules.ReservationSpec(team=vision, image="img",
                                                                     gpu_request=Decimal("0.25"), gpu_memory_mib=1024))
        services.place(r.pk, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.25"), 1024)])
        services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", "test")
    vision.idle_reclaim, vision.idle_warning_s = True, 1800
    vision.save()
    page = browser_for("alice").get(f"/reservations/{r.pk}/").content.decode()
    assert "idle-notice" not in page
    assert services.flag_idle(r.pk, True, timezone.now())
    page = browser_for("alice").get(f"/reservations/{r.pk}/").content.decode()
    assert "threshold of 5.0 % of its GPU. It is reclaimed <time" in page
    assert re.search(r">in (29|30) min</time> \(\d\d:\d\d\) unless it is used again", page)
    vision.idle_reclaim = False
    vision.save()
    assert "The team only warns: it keeps running." in browser_for("alice").get(f"/reservations/{r.pk}/").content \
        .decode()


def test_renaming_a_group_in_use_tells_the_admin_what_keeps_the_old_name(fleet, browser_for, teams, people):
    """The page's message and the audit row say the same: the share placed under the old name keeps it."""
    r = services.submit(people["alice"], rules.ReservationSpec(team=teams["vision"], image="busybox:1.36",
                                                              gpu_request=Decimal("0.25"), gpu_memory_mib=1024,
                                                              exclusion="secure", gpu_model="T4"))
    placed(r, Gpu.objects.get(node__name="t4-node-1", index=0))
    group = ExclusionGroup.objects.get(team=teams["vision"], label="secure")
    page = browser_for("carol").post(f"/team/vision/groups/exclusion/{group.pk}/rename/",
                                     {"label": "confidential", "description": ""}, follow=True).content.decode()
    shown = page.replace("&#x27;", "'")
    assert ("Renamed 'secure' to 'confidential': new requests use 'confidential'; 1 placed share and 0 waiting "
            "requests keep 'secure'") in shown
    assert "1 placed share and 0 waiting requests keep 'secure'" in AuditEntry.objects.get(action="renamed").message


def test_group_preview_fragment(fleet, browser_for, teams, people):
    r = services.submit(people["alice"], rules.ReservationSpec(team=teams["vision"], image="busybox:1.36",
                                                              gpu_request=Decimal("0.25"), gpu_memory_mib=1024,
                                                              exclusion="secure", gpu_model="T4"))
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    services.place(r.pk, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.25"), 1024)])
    page = browser_for("carol").get("/team/vision/groups/preview/", {"kind": "exclusion", "label": "open"})
    assert ("GPU 0 on t4-node-1 holds exclusion group <code>secure</code>; a request in <code>open</code> cannot "
            "land there") in page.content.decode()
    assert browser_for("bob").get("/team/vision/groups/preview/", {"kind": "exclusion", "label": "x"}).status_code \
        == 404


def test_drain_cordon_and_token_from_the_fleet_page(fleet, browser_for):
    admin = browser_for("admin")
    node = Node.objects.get(name="t4-node-1")
    assert admin.post("/fleet/nodes/t4-node-1/drain/").status_code == 302
    node.refresh_from_db()
    assert node.status == "draining"
    gpu = Gpu.objects.get(node=node, index=0)
    admin.post(f"/fleet/gpus/{gpu.pk}/cordon/", {"cordon": "1", "reason": "fan noise"})
    gpu.refresh_from_db()
    assert gpu.cordoned
    assert '<small class="cordon-reason">fan noise</small>' in admin.get("/fleet/?node=t4").content.decode()
    page = admin.post("/fleet/nodes/t4-node-1/token/", {"action": "issue"})
    assert page["Cache-Control"].startswith("max-age=0") or "no-cache" in page["Cache-Control"]
    key = page.content.decode().split('data-token')[0].rsplit('value="', 1)[1].split('"')[0]
    assert node_for_token(key).name == "t4-node-1"
    assert {e.action for e in AuditEntry.objects.filter(via="web")} == {"drained", "cordoned", "created"}
    assert browser_for("carol").post("/fleet/nodes/t4-node-1/undrain/").status_code == 403


def test_cordoning_a_gpu_from_the_page_asks_for_a_reason_which_is_audited(fleet, browser_for):
    admin = browser_for("admin")
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    url = f"/fleet/gpus/{gpu.pk}/cordon/"
    for reason, problem in (("", "say why"), ("   ", "say why"), ("x" * 201, "keep it to 200")):
        answer = admin.post(url, {"cordon": "1", "reason": reason, "next": "/fleet/?node=t4"}, follow=True)
        assert "GPU 0 on t4-node-1 was not cordoned: " in answer.content.decode()
        assert problem in answer.content.decode()
    gpu.refresh_from_db()
    assert not gpu.cordoned and not AuditEntry.objects.filter(object_type="gpu").exists()
    admin.post(url, {"cordon": "1", "reason": " fan\nnoise  ", "next": "/fleet/?node=t4"})
    gpu.refresh_from_db()
    assert gpu.cordoned and gpu.cordon_reason == "fan noise"
    entry = AuditEntry.objects.get(object_type="gpu")
    assert (entry.action, entry.actor_label, entry.after["cordon_reason"]) == ("cordoned", "admin", "fan noise")
    admin.post(url, {"cordon": "0", "next": "/fleet/"})  # uncordoning needs no reason
    gpu.refresh_from_db()
    assert not gpu.cordoned and gpu.cordon_reason == ""
    page = admin.get("/fleet/?node=t4-node-1").content.decode()
    assert '<dialog id="cordon-dialog"' in page and 'maxlength="200"' in page
    assert page.count('name="csrfmiddlewaretoken"') < 10  # one cordon form for the page, not one per GPU


def test_the_rows_of_changed_nodes_as_the_page_draws_them(fleet, browser_for):
    admin = browser_for("admin")
    t4 = Node.objects.get(name="t4-node-1")
    a100 = Node.objects.get(name="a100-node-1")
    services_fleet.drain(t4.pk, audit.cli("test"), "disk swap")
    body = admin.get("/fleet/rows/", {"ids": f"{t4.pk},{a100.pk}", "next": "/fleet/?page=1"}).content.decode()
    assert body.count('<li class="node') == 2 and f'data-node-id="{t4.pk}"' in body
    assert 'class="node state-draining" data-node="t4-node-1"' in body and "disk swap" in body
    assert 'name="next" value="/fleet/?page=1"' in body and "1 draining" in body
    # Asked from a page showing only ready nodes: the drained one is not sent back (fleet.js takes
    # its row off that page); a foreign `next` is read as the unfiltered fleet.
    ready_only = admin.get("/fleet/rows/", {"ids": f"{t4.pk},{a100.pk}", "next": "/fleet/?state=ready"})
    assert ready_only.content.decode().count('<li class="node') == 1 and f'data-node-id="{a100.pk}"' in \
        ready_only.content.decode()
    named = admin.get("/fleet/rows/", {"ids": f"{t4.pk},{a100.pk}", "next": "/fleet/?node=a100&state=ready"})
    assert named.content.decode().count('<li class="node') == 1
    elsewhere = admin.get("/fleet/rows/", {"ids": f"{t4.pk},{a100.pk}", "next": "https://evil/?state=ready"})
    assert elsewhere.content.decode().count('<li class="node') == 2
    assert admin.get("/fleet/rows/", {"ids": "1,x"}).status_code == 400
    assert admin.get("/fleet/rows/", {"ids": "1,²"}).status_code == 400
    assert admin.get("/fleet/rows/", {"ids": ",".join(["1"] * 101)}).status_code == 400
    assert browser_for("carol").get("/fleet/rows/", {"ids": str(t4.pk)}).status_code == 403


def test_the_fleet_page_is_compressed_and_a_shown_once_token_is_not(fleet, browser_for):
    admin = browser_for("admin")
    page = admin.get("/fleet/", HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert page["Content-Encoding"] == "gzip" and "Accept-Encoding" in page["Vary"]
    assert gzip.decompress(page.content).decode().count("data-gpu=") == Gpu.objects.count()
    token = admin.post("/fleet/nodes/t4-node-1/token/", {"action": "issue"}, HTTP_ACCEPT_ENCODING="gzip")
    assert "Content-Encoding" not in token and b"data-token" in token.content


def test_fleet_page_queries_do_not_grow_with_shares(fleet, browser_for, teams, people):
    set_any_quota(teams["vision"], gpus=100)
    admin = browser_for("admin")
    admin.get("/fleet/")
    with CaptureQueriesContext(connection) as before:
        assert admin.get("/fleet/").status_code == 200
    for gpu in Gpu.objects.filter(node__name="a100-node-1"):
        r = services.submit(people["alice"], rules.ReservationSpec(team=teams["vision"], image="busybox:1.36",
                                                                  gpu_request=Decimal("0.25"), gpu_memory_mib=1024))
        services.place(r.pk, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.25"), 1024)])
    with CaptureQueriesContext(connection) as after:
        page = admin.get("/fleet/")
    assert len(after.captured_queries) == len(before.captured_queries)
    assert page.content.decode().count('class="slice') == 8


def test_member_defaults_prefill_the_request_form(fleet, browser_for, people):
    m = Membership.objects.get(user=people["alice"])
    r = browser_for("carol").post(f"/team/vision/members/{m.pk}/defaults/", {"default_exclusion": "secure"})
    assert r.status_code == 302
    page = browser_for("alice").get("/reservations/new/").content.decode()
    assert '<option value="secure" selected>' in page
    bad = browser_for("carol").post(f"/team/vision/members/{m.pk}/defaults/", {"default_exclusion": "nope"},
                                    follow=True)
    assert "has no exclusion group &#x27;nope&#x27;; create it first" in bad.content.decode()


def test_tenancy_rows_are_read_only_in_django_admin_and_tokens_are_revoked_by_the_service(browser_for, teams, people):
    # an edit there would skip the writers' checks (quotas within their department's, policy within
    # its limits, what a renamed group does to the team's reservations) and the placement cycle's wake-up
    from portal.tenancy import services as tenancy_services
    from portal.tenancy.models import ApiToken

    people["admin"].is_superuser = True
    people["admin"].save()
    admin = browser_for("admin")
    group = ExclusionGroup.objects.get()
    assert admin.post(f"/admin/tenancy/exclusiongroup/{group.pk}/change/",
                      {"team": teams["vision"].pk, "label": "renamed-in-admin", "description": ""}).status_code == 403
    member = Membership.objects.filter(team=teams["vision"]).first()
    assert admin.post(f"/admin/tenancy/membership/{member.pk}/change/", {"role": "admin"}).status_code == 403
    assert admin.post(f"/admin/tenancy/team/{teams['vision'].pk}/change/",
                      {"quota_gpu_share": "99"}).status_code == 403
    assert admin.get("/admin/tenancy/teampolicy/add/").status_code == 403
    assert ExclusionGroup.objects.get().label == group.label
    assert admin.get(f"/admin/tenancy/exclusiongroup/{group.pk}/change/").status_code == 200  # still shown
    token, _key = tenancy_services.create_token(people["alice"], "laptop")
    admin.post("/admin/tenancy/apitoken/", {"action": "revoke_selected", "_selected_action": [token.pk]})
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_teams_are_not_added_in_django_admin(browser_for, people):
    # a team made there would have no quota row and skip its department's check: the fleet pages
    # and the API make teams through portal.tenancy.teams.create_team
    people["admin"].is_superuser = True
    people["admin"].save()
    admin = browser_for("admin")
    assert admin.get("/admin/tenancy/team/add/").status_code == 403
    assert b"/admin/tenancy/team/add/" not in admin.get("/admin/tenancy/team/").content


def test_rows_with_a_service_writer_are_read_only_in_django_admin_and_its_actions_call_the_services(
        fleet, browser_for, teams, people):
    people["admin"].is_superuser = True
    people["admin"].save()
    admin = browser_for("admin")
    node = Node.objects.get(name="t4-node-1")
    gpu = Gpu.objects.get(node=node, index=0)
    r = services.submit(people["alice"], rules.ReservationSpec(team=teams["vision"], image="img",
                                                                 gpu_request=Decimal("0.25"), gpu_memory_mib=1024))
    # an edit posted by hand is refused: the status, the state and the allocations stay the services'
    assert admin.post(f"/admin/fleet/node/{node.pk}/change/", {"status": "lost"}).status_code == 403
    assert admin.post(f"/admin/reservations/reservation/{r.pk}/change/", {"state": "running"}).status_code == 403
    assert admin.get("/admin/reservations/allocation/add/").status_code == 403
    assert admin.post(f"/admin/reservations/reservation/{r.pk}/delete/", {"post": "yes"}).status_code == 403
    # the pages still show the rows
    assert admin.get(f"/admin/fleet/node/{node.pk}/change/").status_code == 200
    assert admin.get(f"/admin/reservations/reservation/{r.pk}/change/").status_code == 200

    admin.post("/admin/fleet/node/", {"action": "drain_selected", "_selected_action": [node.pk]})
    admin.post("/admin/fleet/gpu/", {"action": "cordon_selected", "_selected_action": [gpu.pk]})
    admin.post("/admin/reservations/reservation/", {"action": "cancel_selected", "_selected_action": [r.pk]})
    node.refresh_from_db()
    gpu.refresh_from_db()
    r.refresh_from_db()
    assert (node.status, gpu.cordoned, r.state) == ("draining", True, "cancelled")
    assert {e.action for e in AuditEntry.objects.filter(via="web")} >= {"drained", "cordoned"}
    assert r.transitions.get(to_state="cancelled").actor_label == "admin"

    # staff who may only look get no actions
    people["carol"].is_staff = True
    people["carol"].save()
    from django.contrib.auth.models import Permission
    people["carol"].user_permissions.add(Permission.objects.get(codename="view_reservation"))
    page = browser_for("carol").get("/admin/reservations/reservation/")
    assert page.status_code == 200 and b"cancel_selected" not in page.content


def test_a_preset_command_is_split_as_a_shell_would_and_shown_back_quoted(fleet, browser_for):
    form = {"name": "Check", "kind": "batch", "gpu_model": "T4", "gpu_request": "0.5", "gpu_limit": "",
            "gpu_memory_mib": "4096", "max_duration_h": "1", "image": "pytorch/pytorch:latest",
            "command": "python -c 'import torch; print(torch.cuda.is_available())'"}
    assert browser_for("carol").post("/team/vision/presets/", form).status_code == 302
    preset = Preset.objects.get(name="Check")
    assert preset.command == ["python", "-c", "import torch; print(torch.cuda.is_available())"]
    page = browser_for("carol").get(f"/team/vision/presets/?edit={preset.pk}").content.decode()
    assert "python -c &#x27;import torch; print(torch.cuda.is_available())&#x27;" in page
    bad = browser_for("carol").post("/team/vision/presets/", form | {"name": "Broken", "command": "python -c 'x"})
    assert bad.status_code == 400 and "could not be split like a shell would" in bad.content.decode()
    assert not Preset.objects.filter(name="Broken").exists()


def test_403_and_404_are_pages_of_the_portal_that_say_what_happened(fleet, browser_for):
    forbidden = browser_for("alice").get("/fleet/")
    page = forbidden.content.decode()
    assert forbidden.status_code == 403
    assert "Not allowed" in page and "only site admins may see the fleet" in page
    assert 'aria-label="Main"' in page  # the navigation is there: the way back
    missing = browser_for("alice").get("/reservations/987654/")
    assert missing.status_code == 404 and "Not found" in missing.content.decode()
    assert 'aria-label="Main"' in missing.content.decode()
    api = browser_for("alice").get("/api/v1/reservations/987654/")
    assert api.status_code == 404 and api.json()["detail"]
