"""Quotas per GPU model as site admins set them and everyone else reads them: the whole list
replaced at once, every bad row named, children's quotas kept within their parent's (with the
numbers, whichever side changes), the team's old flat fields still answering from its `*` row."""

from decimal import Decimal

import pytest

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.errors import RuleViolation
from portal.tenancy import departments, policy, quotas
from portal.tenancy import teams as team_services
from portal.tenancy.models import Department, Quota, Team

BY = audit.cli("test")
A100 = "A100-80GB"


def row(model: str, share, gib=10, gpus=1, **extra) -> dict:
    return {"gpu_model": model, "gpu_share": share, "gpu_memory_gib": gib, "gpus": gpus, **extra}


@pytest.fixture
def research(fleet, teams):
    """Department research (no quota of its own yet) holding vision and nlp, which have no quota rows."""
    made = departments.create_department(BY, "research", "Research")
    Quota.objects.filter(team__in=teams.values()).delete()
    for team in teams.values():
        departments.move_team(team, BY, "research")
    return made


def test_put_replaces_the_whole_list_and_get_answers_it(fleet, client_for, teams):
    admin = client_for("admin")
    first = admin.put("/api/v1/teams/vision/quotas/", [
        row("*", 1, 20, 2), row(A100, "2.5", "160", 3, borrowing_limit={"gpu_share": 1}, lending_limit={
            "gpu_share": "0.5", "gpu_memory_gib": None, "gpus": 1}, weight=2)], format="json")
    assert first.status_code == 200, first.content
    assert first.json() == [
        {"gpu_model": "*", "gpu_share": "1.000", "gpu_memory_gib": "20.000", "gpus": 2, "borrowing_limit": None,
         "lending_limit": None, "weight": "1.000"},
        {"gpu_model": A100, "gpu_share": "2.500", "gpu_memory_gib": "160.000", "gpus": 3,
         "borrowing_limit": {"gpu_share": "1.000", "gpu_memory_gib": None, "gpus": None},
         "lending_limit": {"gpu_share": "0.500", "gpu_memory_gib": None, "gpus": 1}, "weight": "2.000"}]
    second = admin.put("/api/v1/teams/vision/quotas/", [row("T4", "0.5", 8, 1)], format="json")
    assert [r["gpu_model"] for r in second.json()] == ["T4"]
    assert client_for("carol").get("/api/v1/teams/vision/quotas/").json() == second.json()
    assert Quota.objects.filter(team=teams["vision"]).count() == 1
    entry = AuditEntry.objects.filter(object_type="quota").latest("id")
    assert entry.actor_label == "admin" and entry.team == teams["vision"]
    assert entry.after == {"*": None, A100: None, "T4": {
        "gpu_share": "0.500", "gpu_memory_gib": "8.000", "gpus": 1, "borrowing_limit": None, "lending_limit": None,
        "weight": "1.000"}}


def test_label_safe_model_names_are_stored_as_the_fleet_names_them(fleet, client_for, teams):
    # GPU models with spaces (as NVML names them) would be given with dashes in labels; the demo
    # fleet has none, so the name is kept as given.
    r = client_for("admin").put("/api/v1/teams/vision/quotas/", [row(" T4 ", 1)], format="json")
    assert r.status_code == 200 and r.json()[0]["gpu_model"] == "T4"


def test_unknown_model_is_refused_naming_the_known_ones(fleet, client_for, teams):
    r = client_for("admin").put("/api/v1/teams/vision/quotas/", [row("*", 1), row("H100", 1)], format="json")
    assert r.status_code == 400
    assert r.json() == {"quotas[1].gpu_model": [
        "no GPU model 'H100' in the fleet; known models: A100-80GB, T4, V100-32GB (or * for any model)"]}
    assert teams["vision"].quota_gpu_share == Decimal("2.000")  # nothing written


def test_bad_rows_are_each_named_and_nothing_is_written(fleet, teams):
    with pytest.raises(RuleViolation) as refused:
        quotas.replace_quotas(teams["vision"], BY, [
            row("T4", -1), row("T4", 1, gpus=1.5), row(A100, 2, lending_limit={"gpu_share": 3, "gpus": 1}),
            row(A100, 1, weight=0), {"gpu_model": "*"}, row(A100, 100001, colour="red"),
        ])
    assert refused.value.errors == {
        "quotas[0].gpu_share": ["must not be negative (0 to 100000 GPUs of share)"],
        "quotas[1].gpu_model": ["T4 is named twice (rows 0 and 1); give one row per model"],
        "quotas[1].gpus": ["must be a whole number of GPUs (0 to 1000000), got 1.5"],
        "quotas[2].lending_limit": ["gpu_share 3.000 is above the quota 2.000; a unit lends at most its own quota"],
        "quotas[3].gpu_model": ["A100-80GB is named twice (rows 2 and 3); give one row per model"],
        "quotas[3].weight": ["must be a number above 0 and at most 1000 (1: an equal share), got 0"],
        "quotas[4].gpu_share": ["required: a number (0 for none)"],
        "quotas[4].gpu_memory_gib": ["required: a number (0 for none)"],
        "quotas[4].gpus": ["required: a number (0 for none)"],
        "quotas[5].colour": ["not a quota field; the fields are gpu_model, gpu_share, gpu_memory_gib, gpus, "
                             "borrowing_limit, lending_limit, weight"],
        "quotas[5].gpu_model": ["A100-80GB is named twice (rows 2 and 5); give one row per model"],
        "quotas[5].gpu_share": ["must be at most 100000 GPUs of share"],
    }
    with pytest.raises(RuleViolation) as too_many:
        quotas.replace_quotas(teams["vision"], BY, [row("*", 1)] * 65)
    assert too_many.value.errors == {"quotas": ["at most 64 rows (one per GPU model and one for *); got 65"]}
    assert list(Quota.objects.filter(team=teams["vision"]).values_list("gpu_model", "gpu_share")) == \
        [("*", Decimal("2.000"))]


def test_wrong_json_types_in_a_quota_row_are_named(fleet, client_for, teams):
    admin = client_for("admin")
    r = admin.put("/api/v1/teams/vision/quotas/", [row("*", 1, gpus="2"), row("T4", True)], format="json")
    assert r.status_code == 400
    assert r.json() == {"quotas[0].gpus": ["must be a whole number"], "quotas[1].gpu_share": ["must be a number"]}
    nested = admin.put("/api/v1/teams/vision/quotas/", [row("*", 1, borrowing_limit={"gpus": "x"})], format="json")
    assert nested.status_code == 400 and nested.json() == {"quotas[0].borrowing_limit.gpus": ["must be a whole number"]}
    whole = admin.put("/api/v1/teams/vision/quotas/", row("*", 1), format="json")
    assert whole.status_code == 400 and list(whole.json()) == ["quotas"]


def test_children_over_their_parent_are_refused_naming_the_numbers(research, teams):
    vision, nlp = teams["vision"], teams["nlp"]
    quotas.replace_quotas(research, BY, [row(A100, 4, 320, 4), row("*", 1, 40, 2)])
    quotas.replace_quotas(vision, BY, [row(A100, 3, 240, 3)])
    with pytest.raises(RuleViolation) as refused:
        quotas.replace_quotas(nlp, BY, [row(A100, 2, 80, 1)])
    assert refused.value.errors == {"quotas": [
        "research's A100-80GB gpu_share is 4.000; its children nlp 2.000 + vision 3.000 = 5.000 exceed it: raise "
        "research's quota or lower the children's"]}
    assert not Quota.objects.filter(team=nlp).exists()
    # A model the parent has no row for counts against its `*` row.
    with pytest.raises(RuleViolation) as other_model:
        quotas.replace_quotas(nlp, BY, [row("T4", "1.5", 15, 1)])
    assert other_model.value.errors["quotas"][0].startswith(
        "research's * gpu_share is 1.000; its child nlp 1.500 exceeds it")
    quotas.replace_quotas(nlp, BY, [row(A100, 1, 80, 1), row("T4", 1, 15, 1)])


def test_a_department_below_its_children_is_refused_naming_the_numbers(research, teams):
    quotas.replace_quotas(teams["vision"], BY, [row(A100, 3, 240, 3)])
    quotas.replace_quotas(teams["nlp"], BY, [row(A100, 2, 80, 1)])
    with pytest.raises(RuleViolation) as refused:
        quotas.replace_quotas(research, BY, [row(A100, 4, 400, 8)])
    assert refused.value.errors == {"quotas": [
        "research's A100-80GB gpu_share is 4.000; its children nlp 2.000 + vision 3.000 = 5.000 exceed it: raise "
        "research's quota or lower the children's"]}
    assert quotas.quotas_of(research) == []
    quotas.replace_quotas(research, BY, [row(A100, 5, 400, 8)])


def test_a_department_without_rows_counts_as_its_children_at_the_parent(research, teams):
    departments.create_department(BY, "perception", "Perception", "research")
    departments.move_team(teams["vision"], BY, "perception")
    quotas.replace_quotas(research, BY, [row(A100, 4, 400, 8)])
    quotas.replace_quotas(teams["nlp"], BY, [row(A100, 2, 80, 1)])
    with pytest.raises(RuleViolation) as refused:
        quotas.replace_quotas(teams["vision"], BY, [row(A100, 3, 240, 3)])
    assert refused.value.errors["quotas"][0].startswith(
        "research's A100-80GB gpu_share is 4.000; its children nlp 2.000 + perception 3.000 = 5.000 exceed it")
    # With a `*` row of its own, perception's children count against it, and perception against research's *.
    quotas.replace_quotas(Department.objects.get(slug="perception"), BY, [row("*", 3, 240, 3)])
    with pytest.raises(RuleViolation) as over:
        quotas.replace_quotas(teams["nlp"], BY, [row(A100, 5, 80, 1)])
    assert over.value.errors["quotas"][0].startswith(
        "research's A100-80GB gpu_share is 4.000; its child nlp 5.000 exceeds it")


def test_moving_a_team_where_its_quota_does_not_fit_is_refused(research, teams, client_for):
    quotas.replace_quotas(research, BY, [row("*", 2, 100, 4)])
    departments.move_team(teams["vision"], BY, None)
    quotas.replace_quotas(teams["vision"], BY, [row("*", 3, 10, 1)])
    r = client_for("admin").patch("/api/v1/teams/vision/", {"department": "research", "quota_max_gpus": 1},
                                  format="json")
    assert r.status_code == 400
    assert r.json() == {"department": [
        "research's * gpu_share is 2.000; its child vision 3.000 exceeds it: raise research's quota or lower the "
        "child's"]}
    assert Team.objects.get(slug="vision").department is None


def test_old_team_fields_read_and_write_the_any_model_row(fleet, client_for, teams):
    admin = client_for("admin")
    team = admin.get("/api/v1/teams/vision/").json()
    assert (team["quota_gpu_share"], team["quota_memory_mib"], team["quota_max_gpus"]) == (2.0, 200_001, 4)
    changed = admin.patch("/api/v1/teams/vision/", {"quota_gpu_share": 3.5, "quota_memory_mib": 81920},
                          format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["quota_gpu_share"], changed.json()["quota_memory_mib"]) == (3.5, 81920)
    star = admin.get("/api/v1/teams/vision/quotas/").json()[0]
    assert (star["gpu_model"], star["gpu_share"], star["gpu_memory_gib"], star["gpus"]) == ("*", "3.500", "80.000", 4)
    # Per-model rows leave the old fields alone; without a `*` row they read 0, and writing one makes it.
    admin.put("/api/v1/teams/vision/quotas/", [row(A100, 2)], format="json")
    team = admin.get("/api/v1/teams/vision/").json()
    assert (team["quota_gpu_share"], team["quota_memory_mib"], team["quota_max_gpus"]) == (0, 0, 0)
    admin.patch("/api/v1/teams/vision/", {"quota_max_gpus": 2}, format="json")
    assert [(r["gpu_model"], r["gpu_share"], r["gpus"]) for r in admin.get("/api/v1/teams/vision/quotas/").json()] \
        == [("*", "0.000", 2), (A100, "2.000", 1)]
    made = admin.post("/api/v1/teams/", {"slug": "audio", "name": "Audio"}, format="json")
    assert made.status_code == 201, made.content
    assert (made.json()["quota_gpu_share"], made.json()["quota_memory_mib"], made.json()["quota_max_gpus"]) == \
        (1.0, 81920, 4)
    props = admin.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()[
        "components"]["schemas"]["Team"]["properties"]
    assert all(props[f]["deprecated"] for f in ("quota_gpu_share", "quota_memory_mib", "quota_max_gpus"))


def test_old_team_fields_are_held_to_the_department_like_rows(research, teams, client_for):
    quotas.replace_quotas(research, BY, [row("*", 2, 100, 4)])
    quotas.replace_quotas(teams["nlp"], BY, [row("*", "1.5", 50, 2)])
    r = client_for("admin").patch("/api/v1/teams/vision/", {"quota_gpu_share": 1, "quota_max_gpus": 3},
                                  format="json")
    assert r.status_code == 400
    assert r.json() == {
        "quota_gpu_share": ["research's * gpu_share is 2.000; its children nlp 1.500 + vision 1.000 = 2.500 exceed "
                            "it: raise research's quota or lower the children's"],
        "quota_max_gpus": ["research's * gpus is 4; its children nlp 2 + vision 3 = 5 exceed it: raise research's "
                           "quota or lower the children's"]}
    with pytest.raises(RuleViolation) as refused:
        team_services.create_team(BY, "audio", "Audio", department="research")
    assert refused.value.errors["department"][0].startswith(
        "research's * gpu_share is 2.000; its children audio 1.000 + nlp 1.500 = 2.500 exceed it")
    assert not Team.objects.filter(slug="audio").exists()
    audio = team_services.create_team(BY, "audio", "Audio", department="research", quota_gpu_share="0.5",
                                      quota_memory_mib=1024, quota_max_gpus=1)
    assert audio.department.slug == "research" and audio.quota_gpu_share == Decimal("0.500")


def test_non_staff_cannot_write_quotas_and_see_only_their_own(research, client_for, teams):
    quotas.replace_quotas(teams["nlp"], BY, [row("*", 1)])
    departments.create_department(BY, "language", "Language")
    departments.move_team(teams["nlp"], BY, "language")
    body = [row("*", 5)]
    for who in ("alice", "carol", "dave"):
        client = client_for(who)
        assert client.get("/api/v1/teams/vision/quotas/").status_code == 200
        assert client.put("/api/v1/teams/vision/quotas/", body, format="json").status_code == 403
        assert client.get("/api/v1/departments/research/quotas/").status_code == 200
        assert client.put("/api/v1/departments/research/quotas/", body, format="json").status_code == 403
        assert client.get("/api/v1/teams/nlp/quotas/").status_code == 404
        assert client.put("/api/v1/teams/nlp/quotas/", body, format="json").status_code == 404
        assert client.get("/api/v1/departments/language/quotas/").status_code == 404
        assert client.put("/api/v1/departments/language/quotas/", body, format="json").status_code == 404
    assert client_for("admin").put("/api/v1/departments/language/quotas/", body, format="json").status_code == 200
    assert quotas.quotas_of(teams["nlp"])[0]["gpu_share"] == Decimal("1.000")


def test_reclaim_grace_is_set_by_team_admins_within_a_day(client_for, teams, people):
    assert policy.policy_of(teams["vision"]).reclaim_grace_s == 300
    carol = client_for("carol")
    assert carol.get("/api/v1/teams/vision/policy/").json()["reclaim_grace_s"] == 300
    r = carol.patch("/api/v1/teams/vision/policy/", {"reclaim_grace_s": 0}, format="json")
    assert r.status_code == 200 and r.json()["reclaim_grace_s"] == 0
    for bad in (-1, 86401):
        refused = carol.patch("/api/v1/teams/vision/policy/", {"reclaim_grace_s": bad}, format="json")
        assert refused.status_code == 400
        assert refused.json() == {"reclaim_grace_s": ["must be between 0 and 86400"]}
    assert carol.patch("/api/v1/teams/vision/policy/", {"reclaim_grace_s": "60"}, format="json").status_code == 400
    assert client_for("alice").patch("/api/v1/teams/vision/policy/", {"reclaim_grace_s": 60},
                                     format="json").status_code == 403
    p = policy.set_policy(teams["vision"], audit.web(people["carol"]), {"reclaim_grace_s": "86400"})
    assert p.reclaim_grace_s == 86400 == policy.policy_of(Team.objects.get(slug="vision")).reclaim_grace_s
    assert AuditEntry.objects.filter(object_type="policy").latest("id").after == {"reclaim_grace_s": 86400}
