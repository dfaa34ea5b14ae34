"""Remote GPU shares as a team and its members see them: a request may allow a remote share only
where the team's policy permits it; refused with what to do otherwise."""

from __future__ import annotations

from portal.audit.models import AuditEntry
from portal.reservations.models import Reservation


def test_api_refuses_remote_until_the_team_allows_it(fleet, client_for, reservation_body):
    alice, carol = client_for("alice"), client_for("carol")
    refused = alice.post("/api/v1/reservations/", reservation_body(remote_allowed=True), format="json")
    assert refused.status_code == 400, refused.content
    assert refused.json()["remote_allowed"] == [
        "team vision does not allow remote GPU shares; ask a team admin to allow them, or leave this off"]
    assert not Reservation.objects.exists()

    assert carol.get("/api/v1/teams/vision/policy/").json()["allow_remote"] is False
    changed = carol.patch("/api/v1/teams/vision/policy/", {"allow_remote": True}, format="json")
    assert changed.status_code == 200 and changed.json()["allow_remote"] is True
    assert AuditEntry.objects.filter(object_type="policy", team__slug="vision").exists()

    made = alice.post("/api/v1/reservations/", reservation_body(remote_allowed=True), format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["remote_allowed"] is True and body["sharing"] == "" and body["client_node"] is None
    assert Reservation.objects.get(pk=body["id"]).remote_allowed

    # Without asking, a request stays where its pod runs, whatever the policy.
    plain = alice.post("/api/v1/reservations/", reservation_body(), format="json").json()
    assert plain["remote_allowed"] is False


def test_whole_gpus_are_never_remote(fleet, client_for, reservation_body):
    client_for("carol").patch("/api/v1/teams/vision/policy/", {"allow_remote": True}, format="json")
    r = client_for("alice").post("/api/v1/reservations/", reservation_body(remote_allowed=True, gpu_request=1),
                                 format="json")
    assert r.status_code == 400
    assert "only a share of one GPU (below 1) can be remote" in r.json()["remote_allowed"][0]


def test_policy_switch_must_be_a_boolean_and_members_cannot_set_it(fleet, client_for):
    r = client_for("carol").patch("/api/v1/teams/vision/policy/", {"allow_remote": "maybe"}, format="json")
    assert r.status_code == 400 and "allow_remote" in r.json()
    assert client_for("alice").patch("/api/v1/teams/vision/policy/", {"allow_remote": True},
                                     format="json").status_code == 403
    assert client_for("erin").patch("/api/v1/teams/vision/policy/", {"allow_remote": True},
                                    format="json").status_code == 404


def _form(**overrides) -> dict:
    data = {"team": "vision", "kind": "batch", "image": "busybox:1", "command": "", "gpu_model": "",
            "gpu_request": "0.25", "gpu_limit": "", "memory_gib": "4", "gpu_count": "1", "hours": "",
            "priority": "50"}
    return data | overrides


def test_request_form_offers_remote_only_where_the_team_allows_it(fleet, people):
    from django.test import Client

    from portal.tenancy.models import TeamPolicy

    alice = Client()
    alice.force_login(people["alice"])
    page = alice.get("/reservations/new/").content.decode()
    assert "Team vision does not allow remote shares." in page
    assert 'name="remote_allowed"' in page and "disabled" in page.split('name="remote_allowed"')[1].split(">")[0]
    # A disabled box cannot be ticked by posting it anyway.
    alice.post("/reservations/new/", _form(remote_allowed="on"))
    assert Reservation.objects.get().remote_allowed is False

    TeamPolicy.objects.create(team=people["alice"].memberships.get().team, allow_remote=True)
    whole = alice.post("/reservations/new/", _form(remote_allowed="on", gpu_request="1"))
    assert "Only a share below one GPU can be remote" in whole.content.decode()
    r = alice.post("/reservations/new/", _form(remote_allowed="on"))
    assert r.status_code == 302
    assert Reservation.objects.latest("id").remote_allowed is True


def test_team_admin_turns_remote_shares_on_in_the_policy_page(fleet, people):
    from django.test import Client

    from portal.tenancy.policy import policy_of

    carol = Client()
    carol.force_login(people["carol"])
    assert 'name="allow_remote"' in carol.get("/team/vision/policy/").content.decode()
    r = carol.post("/team/vision/policy/", {
        "max_duration_h": "8", "interactive_max_h": "4", "idle_threshold_pct": "10", "idle_after_min": "15",
        "idle_warning_min": "15", "idle_action": "warn", "max_priority_member": "40", "max_priority_admin": "60",
        "allow_remote": "on"})
    assert r.status_code == 302
    team = people["carol"].memberships.get().team
    assert policy_of(team).allow_remote is True
    page = carol.get("/team/vision/policy/").content.decode()
    assert 'name="allow_remote" checked' in page
