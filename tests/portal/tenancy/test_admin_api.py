"""The admin API as team admins and site admins use it: every change audited, bad input refused
with what to do, nothing half-written, other teams' objects 404."""

from decimal import Decimal

import pytest

from portal.audit.models import AuditEntry
from portal.fleet.models import Gpu, Node
from portal.fleet.services import node_for_token
from portal.placement import snapshot
from portal.reservations import rules, services
from portal.tenancy.models import ExclusionGroup, Membership, Preset


def test_carol_adds_bob_by_email_changes_role_and_removes_him(client_for, people):
    people["bob"].email = "bob@example.com"
    people["bob"].save()
    carol = client_for("carol")
    r = carol.post("/api/v1/memberships/", {"team": "vision", "user": "BOB@example.com"}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["user"] == "bob" and r.json()["effect"] == \
        "bob will see vision's reservations and may request GPU shares for it"
    again = carol.post("/api/v1/memberships/", {"team": "vision", "user": "bob"}, format="json")
    assert again.status_code == 400
    assert again.json()["user"] == ["bob is already in team vision (as member); change their role instead"]
    unknown = carol.post("/api/v1/memberships/", {"team": "vision", "user": "zed"}, format="json")
    assert "no user 'zed'" in unknown.json()["user"][0]
    pk = r.json()["id"]
    assert carol.patch(f"/api/v1/memberships/{pk}/", {"role": "manager"}, format="json").json()["role"] == "manager"
    changed = carol.patch(f"/api/v1/memberships/{pk}/", {"default_exclusion": "secure"}, format="json")
    assert changed.status_code == 200 and changed.json()["default_exclusion"] == "secure"
    unknown_group = carol.patch(f"/api/v1/memberships/{pk}/", {"default_exclusion": "nope"}, format="json")
    assert unknown_group.status_code == 400 and "create it first" in unknown_group.json()["default_exclusion"][0]
    assert carol.delete(f"/api/v1/memberships/{pk}/").status_code == 204
    assert not Membership.objects.filter(pk=pk).exists()
    actions = list(AuditEntry.objects.filter(object_type="membership").order_by("id")
                   .values_list("action", "actor_label", "via"))
    assert actions == [("added", "carol", "api"), ("role changed", "carol", "api"),
                       ("defaults changed", "carol", "api"), ("removed", "carol", "api")]


def test_the_only_admin_cannot_leave_or_step_down(client_for, people):
    own = Membership.objects.get(user=people["carol"])
    r = client_for("carol").patch(f"/api/v1/memberships/{own.pk}/", {"role": "member"}, format="json")
    assert r.status_code == 400 and "only admin; make someone else admin first" in r.json()["role"][0]
    assert client_for("carol").delete(f"/api/v1/memberships/{own.pk}/").status_code == 400
    own.refresh_from_db()
    assert own.role == "admin"


def test_group_name_clash_rename_and_preview(fleet, client_for, teams, people):
    carol = client_for("carol")
    clash = carol.post("/api/v1/exclusion-groups/", {"team": "vision", "label": "secure"}, format="json")
    assert clash.status_code == 400 and "already has an exclusion group 'secure'" in clash.json()["label"][0]
    made = carol.post("/api/v1/exclusion-groups/", {"team": "vision", "label": "secret"}, format="json").json()
    r = services.submit(people["alice"], rules.ReservationSpec(team=teams["vision"], image="busybox:1.36",
                                                              gpu_request=Decimal("0.25"), gpu_memory_mib=1024,
                                                              exclusion="secret", gpu_model="T4"))
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    services.place(r.pk, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.25"), 1024)])
    lines = carol.get(f"/api/v1/exclusion-groups/{made['id']}/preview/").json()["lines"]
    assert "GPU 0 on t4-node-1 holds exclusion group `secret`: only requests in `secret` can join it" in lines
    other = ExclusionGroup.objects.get(label="secure")
    lines = carol.get(f"/api/v1/exclusion-groups/{other.pk}/preview/").json()["lines"]
    assert "GPU 0 on t4-node-1 holds exclusion group `secret`; a request in `secure` cannot land there" in lines
    renamed = carol.patch(f"/api/v1/exclusion-groups/{made['id']}/", {"label": "confidential"}, format="json")
    assert renamed.status_code == 200
    entry = AuditEntry.objects.get(action="renamed")
    assert "1 placed share and 0 waiting requests keep 'secret'" in entry.message
    r.refresh_from_db()
    assert r.exclusion == "secret"  # running shares are never moved or relabelled
    assert client_for("bob").get(f"/api/v1/exclusion-groups/{made['id']}/preview/").status_code == 404


def test_presets_are_made_by_team_admins_and_read_by_members(fleet, client_for):
    body = {"team": "vision", "name": "Notebook", "gpu_model": "T4", "gpu_request": 0.25, "gpu_memory_mib": 4096,
            "image": "jupyter/base-notebook:latest"}
    assert client_for("alice").post("/api/v1/presets/", body, format="json").status_code == 403
    made = client_for("carol").post("/api/v1/presets/", body, format="json")
    assert made.status_code == 201, made.content
    assert [p["name"] for p in client_for("alice").get("/api/v1/presets/").json()["results"]] == ["Notebook"]
    assert client_for("bob").get(f"/api/v1/presets/{made.json()['id']}/").status_code == 404
    too_big = client_for("carol").post("/api/v1/presets/", {**body, "name": "Big", "gpu_memory_mib": 99999},
                                       format="json")
    assert too_big.status_code == 400 and "gpu_memory_mib" in too_big.json()
    assert Preset.objects.count() == 1


def test_policy_within_limits_through_the_api(client_for):
    carol, admin = client_for("carol"), client_for("admin")
    assert admin.patch("/api/v1/teams/vision/limits/", {"limit_priority": 60}, format="json").status_code == 200
    assert carol.patch("/api/v1/teams/vision/limits/", {"limit_priority": 100}, format="json").status_code == 403
    r = carol.patch("/api/v1/teams/vision/policy/", {"max_priority_member": 70, "idle_reclaim": True}, format="json")
    assert r.status_code == 400 and r.json() == {
        "max_priority_member": ["the site admins allow this team priorities up to 60"]}
    assert client_for("carol").get("/api/v1/teams/vision/policy/").json()["idle_reclaim"] is False
    r = carol.patch("/api/v1/teams/vision/policy/", {"max_priority_member": 40, "idle_threshold": 0.2,
                                                     "idle_after_s": 900}, format="json")
    assert r.status_code == 200 and r.json()["max_priority_member"] == 40
    assert client_for("alice").patch("/api/v1/teams/vision/policy/", {"idle_after_s": 600},
                                     format="json").status_code == 403
    assert client_for("bob").get("/api/v1/teams/vision/policy/").status_code == 404


def test_quota_below_what_is_in_use_is_allowed(fleet, client_for, teams, people):
    # Work beyond a quota is borrowed (and reclaimable), so a quota below what is held is no error.
    services.submit(people["alice"], rules.ReservationSpec(team=teams["vision"], image="busybox:1.36",
                                                          gpu_request=Decimal("1"), gpu_memory_mib=1024))
    r = client_for("admin").patch("/api/v1/teams/vision/", {"quota_gpu_share": 0.5}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["quota_gpu_share"] == 0.5
    teams["vision"].refresh_from_db()
    assert teams["vision"].quota_gpu_share == Decimal("0.500")
    usage = client_for("carol").get("/api/v1/teams/vision/usage/").json()
    # A waiting reservation holds nothing yet: quota is charged when it is placed.
    assert usage["in_use"]["gpu_share"] == "0.000" and usage["members"][0]["username"] == "alice"
    assert usage["waiting"][0]["owner"] == "alice" and usage["waiting_total"] == 1
    made = client_for("admin").post("/api/v1/teams/", {"slug": "audio", "name": "Audio", "quota_gpu_share": 1,
                                                       "quota_memory_mib": 1, "quota_max_gpus": 1}, format="json")
    assert made.status_code == 201
    dup = client_for("admin").post("/api/v1/teams/", {"slug": "audio", "name": "Audio 2", "quota_gpu_share": 1,
                                                      "quota_memory_mib": 1, "quota_max_gpus": 1}, format="json")
    assert dup.status_code == 400
    assert AuditEntry.objects.filter(object_type="team", action="created").count() == 1


def test_node_token_rotation_refuses_the_old_key(fleet, client_for):
    first = client_for("admin").post("/api/v1/nodes/t4-node-1/token/").json()["key"]
    second = client_for("admin").post("/api/v1/nodes/t4-node-1/token/").json()["key"]
    assert node_for_token(first) is None and node_for_token(second).name == "t4-node-1"
    assert client_for("carol").post("/api/v1/nodes/t4-node-1/token/").status_code == 403
    assert client_for("admin").delete("/api/v1/nodes/t4-node-1/token/").status_code == 204
    assert node_for_token(second) is None
    assert list(AuditEntry.objects.filter(object_type="node_token").order_by("id").values_list("action", flat=True)) \
        == ["created", "rotated", "revoked"]


def test_cordoned_gpu_leaves_the_placement_snapshot(fleet, client_for):
    gpu = Gpu.objects.get(node__name="t4-node-1", index=1)
    assert client_for("admin").post(f"/api/v1/gpus/{gpu.uuid}/cordon/", {"reason": "fan noise"},
                                    format="json").json()["cordoned"] is True
    t4 = next(n for n in snapshot.build().nodes if n.name == "t4-node-1")
    assert [g.index for g in t4.gpus] == [0]
    listed = client_for("alice").get("/api/v1/gpus/", {"node__name": "t4-node-1"}).json()["results"]
    assert [(g["index"], g["cordoned"], g["cordon_reason"]) for g in listed] == [(0, False, ""), (1, True, "fan noise")]
    client_for("admin").delete(f"/api/v1/gpus/{gpu.uuid}/cordon/")
    t4 = next(n for n in snapshot.build().nodes if n.name == "t4-node-1")
    assert [g.index for g in t4.gpus] == [0, 1]


@pytest.mark.parametrize(("who", "status", "teams_seen"), [
    ("admin", 200, {"vision", "nlp", None}), ("carol", 200, {"vision"}), ("erin", 200, {"nlp"}),
    ("alice", 403, None), ("dave", 403, None),
])
def test_audit_log_visibility_and_filters(fleet, client_for, who, status, teams_seen):
    client_for("carol").post("/api/v1/exclusion-groups/", {"team": "vision", "label": "one"}, format="json")
    client_for("erin").post("/api/v1/exclusion-groups/", {"team": "nlp", "label": "two"}, format="json")
    client_for("admin").post("/api/v1/nodes/t4-node-1/drain/", {"reason": "x"}, format="json")
    r = client_for(who).get("/api/v1/audit/")
    assert r.status_code == status
    if status == 200:
        assert {e["team"] for e in r.json()["results"]} == teams_seen
    if who == "admin":
        node = Node.objects.get(name="t4-node-1")
        only = client_for(who).get("/api/v1/audit/", {"object_type": "node", "object_id": node.pk}).json()
        assert [(e["action"], e["before"]["status"], e["after"]["status"]) for e in only["results"]] == [
            ("drained", "ready", "draining")]
        assert client_for(who).get("/api/v1/audit/", {"user": "carol"}).json()["count"] == 1
        assert client_for(who).get("/api/v1/audit/", {"since": "soon"}).status_code == 400
