"""Departments as site admins arrange them and everyone else sees them: nested at most 4 levels,
never under themselves, deleted only when empty; teams moved between them; other people's
departments are 404, and only site admins write."""

import pytest

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.errors import RuleViolation
from portal.tenancy import departments
from portal.tenancy.models import Department

BY = audit.cli("test")


def chain(*slugs: str) -> list[Department]:
    """Departments nested in the order given (the first at the top)."""
    made, parent = [], None
    for slug in slugs:
        made.append(departments.create_department(BY, slug, slug.title(), parent))
        parent = slug
    return made


def test_departments_nest_four_levels_and_a_fifth_is_refused_with_its_level(db):
    chain("org-a", "org-b", "org-c", "org-d")
    with pytest.raises(RuleViolation) as refused:
        departments.create_department(BY, "org-e", "Too deep", "org-d")
    assert refused.value.errors == {"parent": [
        "under org-d (level 4), org-e would be at level 5; departments nest at most 4 levels deep"]}
    assert not Department.objects.filter(slug="org-e").exists()


def test_moving_a_department_refuses_a_depth_past_four_counting_its_subtree(db):
    chain("top", "mid", "low")
    chain("other", "other-child")
    with pytest.raises(RuleViolation) as refused:
        departments.update_department(Department.objects.get(slug="other"), BY, {"parent": "low"})
    assert refused.value.errors == {"parent": [
        "under low (level 3), other would be at level 4 and its deepest department at level 5; departments nest "
        "at most 4 levels deep"]}
    moved = departments.update_department(Department.objects.get(slug="other"), BY, {"parent": "mid"})
    assert moved.parent.slug == "mid"


def test_a_department_cannot_go_under_itself_or_its_own_departments(db):
    top, _, _ = chain("research", "vision-group", "detection")
    with pytest.raises(RuleViolation) as refused:
        departments.update_department(top, BY, {"parent": "detection"})
    assert refused.value.errors == {"parent": [
        "detection is inside research (research → vision-group → detection); a department cannot go under one of "
        "its own departments"]}
    with pytest.raises(RuleViolation) as itself:
        departments.update_department(top, BY, {"parent": "research"})
    assert itself.value.errors == {"parent": ["a department cannot be its own parent (research)"]}
    top.refresh_from_db()
    assert top.parent is None


def test_delete_is_refused_while_teams_or_departments_remain(teams):
    research, _ = chain("research", "vision-group")
    departments.move_team(teams["vision"], BY, "research")
    departments.move_team(teams["nlp"], BY, "research")
    with pytest.raises(RuleViolation) as refused:
        departments.delete_department(research, BY)
    assert refused.value.errors == {"department": [
        "department research still holds teams nlp, vision and department vision-group; move them elsewhere first"]}
    departments.move_team(teams["vision"], BY, None)
    departments.move_team(teams["nlp"], BY, None)
    departments.delete_department(Department.objects.get(slug="vision-group"), BY)
    departments.delete_department(research, BY)
    assert not Department.objects.exists()
    entries = AuditEntry.objects.filter(object_type="department").order_by("id")
    assert list(entries.values_list("action", "object_repr")) == [
        ("created", "research"), ("created", "vision-group"), ("deleted", "vision-group"), ("deleted", "research")]


def test_new_departments_are_checked_like_teams(db):
    chain("research")
    with pytest.raises(RuleViolation) as refused:
        departments.create_department(BY, "Research!", "", "nowhere")
    assert refused.value.errors == {
        "slug": ["use 1-50 lowercase letters, digits and '-', starting and ending with a letter or digit"],
        "name": ["give the department a name of 1-120 characters"],
        "parent": ["no department 'nowhere'; create it first, or leave this blank for none"]}
    with pytest.raises(RuleViolation, match="already a department 'research'"):
        departments.create_department(BY, "research", "Again")


# Through the API.

def test_site_admin_builds_the_tree_through_the_api(client_for, teams):
    admin = client_for("admin")
    made = admin.post("/api/v1/departments/", {"slug": "research", "name": "Research", "parent": None}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["slug"] == "research" and made.json()["parent"] is None
    child = admin.post("/api/v1/departments/", {"slug": "perception", "name": "Perception", "parent": "research"},
                       format="json")
    assert child.status_code == 201 and child.json()["parent"] == "research"
    renamed = admin.patch("/api/v1/departments/perception/", {"name": "Seeing things"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["name"] == "Seeing things"
    moved = admin.patch("/api/v1/teams/vision/", {"department": "perception"}, format="json")
    assert moved.status_code == 200, moved.content
    assert moved.json()["department"] == "perception"
    assert admin.get("/api/v1/teams/vision/").json()["department"] == "perception"
    audio = admin.post("/api/v1/teams/", {"slug": "audio", "name": "Audio", "department": "research"}, format="json")
    assert audio.status_code == 201 and audio.json()["department"] == "research"
    assert [t["department"] for t in admin.get("/api/v1/teams/").json()["results"]] == ["research", None, "perception"]
    refused = admin.delete("/api/v1/departments/perception/")
    assert refused.status_code == 400
    assert refused.json() == {"department": ["department perception still holds team vision; move it elsewhere "
                                             "first"]}
    cycle = admin.patch("/api/v1/departments/research/", {"parent": "perception"}, format="json")
    assert cycle.status_code == 400 and "inside research" in cycle.json()["parent"][0]
    assert admin.patch("/api/v1/teams/vision/", {"department": None}, format="json").json()["department"] is None
    assert admin.delete("/api/v1/departments/perception/").status_code == 204
    slugs = [d["slug"] for d in admin.get("/api/v1/departments/").json()["results"]]
    assert slugs == ["research"]
    assert admin.delete("/api/v1/departments/research/").status_code == 400  # audio is still there
    assert AuditEntry.objects.get(object_type="team", action="moved", after={"department": None}).actor_label == "admin"


def test_people_see_only_the_departments_their_teams_are_under(client_for, teams):
    chain("research", "perception")
    chain("language")
    departments.move_team(teams["vision"], BY, "perception")
    alice, bob = client_for("alice"), client_for("bob")
    assert [d["slug"] for d in alice.get("/api/v1/departments/").json()["results"]] == ["perception", "research"]
    assert alice.get("/api/v1/departments/research/").status_code == 200
    assert alice.get("/api/v1/departments/language/").status_code == 404
    assert bob.get("/api/v1/departments/").json()["results"] == []
    assert bob.get("/api/v1/departments/research/").status_code == 404
    assert len(client_for("admin").get("/api/v1/departments/").json()["results"]) == 3


@pytest.mark.parametrize(("method", "url", "body"), [
    ("post", "/api/v1/departments/", {"slug": "mine", "name": "Mine"}),
    ("patch", "/api/v1/departments/research/", {"name": "Ours"}),
    ("delete", "/api/v1/departments/research/", None),
    ("patch", "/api/v1/teams/vision/", {"department": None}),
])
def test_only_site_admins_change_departments(client_for, teams, method, url, body):
    chain("research")
    departments.move_team(teams["vision"], BY, "research")
    for who in ("alice", "carol", "dave"):
        response = getattr(client_for(who), method)(url, body, format="json")
        assert response.status_code == 403, (who, response.content)
    assert Department.objects.get().name == "Research"
    teams["vision"].refresh_from_db()
    assert teams["vision"].department.slug == "research"


def test_unknown_department_for_a_team_is_named(client_for, teams):
    r = client_for("admin").patch("/api/v1/teams/vision/", {"department": "nowhere"}, format="json")
    assert r.status_code == 400 and r.json() == {"department": ["no department 'nowhere'"]}
