"""Site admins' departments page and quota editor: who may open them (everyone else 403, as the
fleet pages), every change through the tenancy services, each refusal shown on the form and field
it is about, with the numbers, and nothing written then; the fleet's team pages without the old
flat quota fields."""

import re
from decimal import Decimal

import pytest

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.tenancy import departments
from portal.tenancy.models import Department, Quota, Team, TeamPolicy
from tests.reservations import placed, submitted

BY = audit.cli("test")
A100 = "A100-80GB"



@pytest.fixture
def research(fleet, teams):
    """Department research with a `*` quota of 4 GPUs of share (vision's 2 and nlp's 1.5 fit), vision
    and nlp under it."""
    research = departments.create_department(BY, "research", "Research")
    from portal.tenancy import quotas
    quotas.replace_quotas(research, BY, [{"gpu_model": "*", "gpu_share": "4", "gpu_memory_gib": "400", "gpus": 8}])
    for team in teams.values():
        departments.move_team(team, BY, "research")
    return research


def quota_post(rows: list[dict], action: str = "save") -> dict:
    data = {"rows": str(len(rows)), "action": action}
    for i, r in enumerate(rows):
        data |= {f"r{i}-{k}": str(v) for k, v in r.items()}
    return data


def error_of(html: str, field_id: str) -> str:
    """The text of the error shown for the input with id `field_id` (its aria-describedby)."""
    tag = re.search(rf'<(?:input|select)[^>]*id="{re.escape(field_id)}"[^>]*>', html)
    assert tag and 'aria-invalid="true"' in tag.group(0), f"{field_id} not marked"
    described = re.search(r'aria-describedby="([^"]+)"', tag.group(0)).group(1)
    found = re.search(rf'<p class="error" id="{re.escape(described)}"[^>]*>(.*?)</p>', html, re.S)
    assert found, f"no error shown for {field_id}"
    return found.group(1)


@pytest.mark.parametrize("url", ["/fleet/departments/", "/fleet/departments/research/quotas/",
                                 "/fleet/teams/vision/quotas/"])
@pytest.mark.parametrize(("who", "status"), [("admin", 200), ("carol", 403), ("alice", 403), ("dave", 403),
                                             ("erin", 403)])
def test_department_pages_only_for_site_admins(research, browser_for, url, who, status):
    assert browser_for(who).get(url).status_code == status


@pytest.mark.parametrize(("who", "status"), [("carol", 403), ("bob", 403)])
def test_actions_refused_to_everyone_but_site_admins(research, browser_for, teams, who, status):
    assert browser_for(who).post("/fleet/departments/", {"action": "delete", "department": "research"}).status_code \
        == status
    assert browser_for(who).post("/fleet/departments/", {"action": "move-team", "team": "vision",
                                                         "department": ""}).status_code == status
    r = browser_for(who).post("/fleet/teams/vision/quotas/", quota_post([{"gpu_model": "*", "gpu_share": "9",
                                                                          "gpu_memory_gib": "9", "gpus": 9}]))
    assert r.status_code == status
    assert Department.objects.filter(slug="research").exists() and Team.objects.get(slug="vision").department_id
    assert Quota.objects.get(team=teams["vision"]).gpu_share == Decimal("2.000")


def test_unknown_units_are_404_for_site_admins(research, browser_for):
    admin = browser_for("admin")
    assert admin.get("/fleet/departments/nosuch/quotas/").status_code == 404
    assert admin.get("/fleet/teams/nosuch/quotas/").status_code == 404
    assert admin.post("/fleet/departments/", {"action": "delete", "department": "nosuch"}).status_code == 404
    assert admin.post("/fleet/departments/", {"action": "move-team", "team": "nosuch"}).status_code == 404


def test_the_tree_shows_departments_teams_and_where_each_stands(research, browser_for, teams, people, fleet):
    a100s = list(fleet.filter(model=A100).order_by("node__name", "index"))
    # nlp holds 2.5 GPUs of share, 1.0 beyond its quota of 1.5, from what vision leaves unused.
    for gpu, share, admission in ((a100s[0], "1.0", "guaranteed"), (a100s[1], "0.5", "guaranteed"),
                                  (a100s[2], "1.0", "borrowed")):
        placed(submitted(people["bob"], teams["nlp"], gpu_request=Decimal(share), gpu_limit=Decimal(share),
                         gpu_memory_mib=1024, gpu_model=A100), gpu, admission=admission)
    html = browser_for("admin").get("/fleet/departments/").content.decode()
    assert 'id="department-research"' in html and 'id="team-vision"' in html and 'id="team-nlp"' in html
    assert "department · level 1" in html
    # The chart's data and its table: one per bucket (here `*` only), per unit.
    assert 'data-bucket-chart="bucket-0"' in html and '"units": ["Research", "NLP", "Vision"]' in html
    table = html[html.index('<table class="table standing" data-bucket="*"'):]
    table = table[:table.index("</table>")]
    nlp = table[table.index('data-unit="nlp"'):]
    nlp = nlp[:nlp.index("</tr>")]
    assert re.findall(r'<span class="amt">([\d.]+)</span>', nlp) == ["1.5", "2.5", "1"]  # quota, in use, borrowed
    vision = table[table.index('data-unit="vision"'):]
    vision = vision[:vision.index("</tr>")]
    assert re.findall(r'<span class="amt">([\d.]+)</span>', vision) == ["2", "1"]  # quota, lent (nothing in use)


def test_create_rename_move_and_delete_departments(research, browser_for):
    admin = browser_for("admin")
    r = admin.post("/fleet/departments/", {"action": "create", "slug": "vision-lab", "name": "Vision lab",
                                           "parent": "research"})
    assert r.status_code == 302
    lab = Department.objects.get(slug="vision-lab")
    assert lab.parent.slug == "research"
    page = admin.get("/fleet/departments/").content.decode()
    assert "Department vision-lab created under research" in page
    r = admin.post("/fleet/departments/", {"action": "update", "department": "vision-lab", "name": "Vision Lab",
                                           "parent": ""}, follow=True)
    lab.refresh_from_db()
    assert lab.name == "Vision Lab" and lab.parent is None
    assert "it is now under the organisation" in r.content.decode()
    r = admin.post("/fleet/departments/", {"action": "delete", "department": "vision-lab"}, follow=True)
    assert not Department.objects.filter(slug="vision-lab").exists()
    assert {e.action for e in AuditEntry.objects.filter(object_type="department", via="web")} == {
        "created", "moved", "deleted"}


def test_refusals_are_shown_on_their_form(research, browser_for):
    admin = browser_for("admin")
    r = admin.post("/fleet/departments/", {"action": "create", "slug": "Bad Slug", "name": "", "parent": ""})
    assert r.status_code == 400
    html = r.content.decode()
    assert "use 1-50 lowercase letters" in error_of(html, "id_slug")
    assert "give the department a name" in error_of(html, "id_name")
    # research holds teams: it cannot go, and says which and what to do.
    r = admin.post("/fleet/departments/", {"action": "delete", "department": "research"})
    html = r.content.decode()
    assert r.status_code == 400 and Department.objects.filter(slug="research").exists()
    assert re.search(r'id="delete-research-error"[^>]*>department research still holds teams nlp, vision; move them '
                     r"elsewhere first</p>", html)
    # Four levels at most: a fifth is refused on the parent field of its form, with the levels.
    for slug, parent in (("l2", "research"), ("l3", "l2"), ("l4", "l3")):
        departments.create_department(BY, slug, slug, parent)
    r = admin.post("/fleet/departments/", {"action": "create", "slug": "l5", "name": "l5", "parent": "l4"})
    assert "l5 would be at level 5; departments nest at most 4 levels deep" in error_of(r.content.decode(),
                                                                                      "id_parent")


def test_moving_a_team_where_its_quota_does_not_fit_is_refused_with_the_numbers(research, browser_for, teams):
    small = departments.create_department(BY, "small", "Small")
    from portal.tenancy import quotas
    quotas.replace_quotas(small, BY, [{"gpu_model": "*", "gpu_share": "1", "gpu_memory_gib": "400", "gpus": 8}])
    r = browser_for("admin").post("/fleet/departments/", {"action": "move-team", "team": "vision",
                                                          "department": "small"})
    assert r.status_code == 400
    assert error_of(r.content.decode(), "move-vision") == (
        "small&#x27;s any-model (*) GPU share is 1.000; its child vision 2.000 exceeds it: raise small&#x27;s quota "
        "or lower the child&#x27;s")
    assert Team.objects.get(slug="vision").department.slug == "research"
    r = browser_for("admin").post("/fleet/departments/", {"action": "move-team", "team": "vision",
                                                          "department": ""}, follow=True)
    assert Team.objects.get(slug="vision").department is None
    assert "Team vision is now under the organisation (no department)" in r.content.decode()


def test_quota_editor_saves_the_rows_through_the_service(research, browser_for, teams):
    admin = browser_for("admin")
    html = admin.get("/fleet/teams/vision/quotas/").content.decode()
    assert 'name="r0-gpu_model"' in html and 'value="2"' in html  # vision's `*` row
    r = admin.post("/fleet/teams/vision/quotas/", quota_post([
        {"gpu_model": "*", "gpu_share": "1", "gpu_memory_gib": "50", "gpus": "2", "weight": ""},
        {"gpu_model": A100, "gpu_share": "1.5", "gpu_memory_gib": "80", "gpus": "2", "borrow_gpu_share": "1",
         "lend_gpus": "1", "weight": "2"}]))
    assert r.status_code == 302 and r["Location"] == "/fleet/teams/vision/quotas/"
    rows = {q.gpu_model: q for q in Quota.objects.filter(team=teams["vision"])}
    assert rows["*"].gpu_share == Decimal("1.000") and rows["*"].weight == Decimal("1.000")
    assert rows[A100].borrow_gpu_share == Decimal("1.000") and rows[A100].borrow_gpus is None
    assert rows[A100].lend_gpus == 1 and rows[A100].weight == Decimal("2.000")
    entry = AuditEntry.objects.filter(object_type="quota").latest("id")
    assert entry.via == "web" and entry.actor_label == "admin"


def test_adding_and_removing_a_row_saves_nothing(research, browser_for, teams):
    admin = browser_for("admin")
    start = [{"gpu_model": "*", "gpu_share": "2", "gpu_memory_gib": "195.313", "gpus": "4"}]
    r = admin.post("/fleet/teams/vision/quotas/", quota_post(start, "add"))
    html = r.content.decode()
    assert r.status_code == 200 and 'name="rows" value="2"' in html and "Not saved yet" in html
    assert 'id="r1-gpu_model"' in html
    r = admin.post("/fleet/teams/vision/quotas/", quota_post([*start, {"gpu_model": A100}], "remove-0"))
    html = r.content.decode()
    assert 'name="rows" value="1"' in html and re.search(r'<option value="A100-80GB" selected>', html)
    assert Quota.objects.filter(team=teams["vision"]).count() == 1


def test_children_that_do_not_fit_are_refused_with_the_numbers_on_the_field(research, browser_for, teams):
    admin = browser_for("admin")
    r = admin.post("/fleet/departments/research/quotas/", quota_post([
        {"gpu_model": "*", "gpu_share": "3", "gpu_memory_gib": "400", "gpus": "8"}]))
    assert r.status_code == 400
    html = r.content.decode()
    assert "Nothing was saved." in html
    assert ("research&#x27;s any-model (*) GPU share is 3.000; its children nlp 1.500 + vision 2.000 = 3.500 exceed "
            "it: raise research&#x27;s quota or lower the children&#x27;s") in html
    assert error_of(html, "r0-gpu_share") == "its units need 3.500 here (nlp 1.500 + vision 2.000)"
    assert Quota.objects.get(department=research).gpu_share == Decimal("4.000")
    # From the child's side: vision's share beyond what research holds for it.
    r = admin.post("/fleet/teams/vision/quotas/", quota_post([
        {"gpu_model": "*", "gpu_share": "3", "gpu_memory_gib": "100", "gpus": "4"}]))
    assert error_of(r.content.decode(), "r0-gpu_share") == (
        "does not fit in research&#x27;s GPU share of 4.000 for any model (*): nlp 1.500 + vision 3.000 = 4.500")


def test_malformed_rows_are_refused_per_field_in_words(research, browser_for, teams):
    r = browser_for("admin").post("/fleet/teams/vision/quotas/", quota_post([
        {"gpu_model": "*", "gpu_share": "lots", "gpu_memory_gib": "", "gpus": "1.5", "lend_gpu_share": "5",
         "borrow_gpu_memory_gib": "-1", "weight": "0"},
        {"gpu_model": "*", "gpu_share": "1", "gpu_memory_gib": "1", "gpus": "1"}]))
    assert r.status_code == 400
    html = r.content.decode()
    assert error_of(html, "r0-gpu_share") == "must be a decimal number of GPUs of share, got &#x27;lots&#x27;"
    assert error_of(html, "r0-gpu_memory_gib") == "required: a number (0 for none)"
    assert "must be a whole number of GPUs" in error_of(html, "r0-gpus")
    assert error_of(html, "r0-borrow_gpu_memory_gib").startswith("must not be negative")
    assert "must be a number above 0" in error_of(html, "r0-weight")
    assert error_of(html, "r1-gpu_model") == "* is named twice (rows 0 and 1); give one row per model"
    assert Quota.objects.get(team=teams["vision"]).gpu_share == Decimal("2.000")


def test_lending_limit_above_the_quota_is_shown_on_the_limit(research, browser_for):
    r = browser_for("admin").post("/fleet/teams/vision/quotas/", quota_post([
        {"gpu_model": "*", "gpu_share": "1", "gpu_memory_gib": "10", "gpus": "1", "lend_gpu_share": "5"}]))
    assert error_of(r.content.decode(), "r0-lend_gpu_share") == (
        "5.000 is above the quota 1.000; a unit lends at most its own quota")


def test_fleet_team_pages_show_quota_rows_not_the_flat_quota(research, browser_for, teams):
    admin = browser_for("admin")
    html = admin.get("/fleet/teams/").content.decode()
    assert "quota_gpu_share" not in html and 'href="/fleet/teams/vision/quotas/"' in html
    row = html[html.index('data-team="vision"'):]
    assert "Research" in row[:row.index("</tr>")] and "any model</strong> 2 GPU" in row[:row.index("</tr>")]
    html = admin.get("/fleet/teams/vision/").content.decode()
    assert "quota_gpu_share" not in html and 'name="department"' in html
    assert 'href="/fleet/teams/vision/quotas/"' in html


def test_creating_a_team_puts_it_in_its_department_with_no_quota_yet(research, browser_for):
    r = browser_for("admin").post("/fleet/teams/", {"slug": "audio", "name": "Audio", "department": "research"})
    assert r.status_code == 302 and r["Location"] == "/fleet/teams/audio/quotas/"
    audio = Team.objects.get(slug="audio")
    assert audio.department.slug == "research"
    assert [(q.gpu_model, q.gpu_share, q.gpus) for q in audio.quotas.all()] == [("*", Decimal("0.000"), 0)]
    r = browser_for("admin").post("/fleet/teams/", {"slug": "audio", "name": "Audio", "department": "nosuch"})
    assert r.status_code == 400
    assert "no department &#x27;nosuch&#x27;" in r.content.decode()


def test_team_page_saves_name_department_and_limits_together(research, browser_for, teams):
    admin = browser_for("admin")
    form = {"name": "Vision!", "department": "", "limit_duration_h": "48", "limit_priority": "80",
            "limit_idle_after_min": "", "limit_idle_threshold_pct": "5", "limit_idle_warning_min": ""}
    assert admin.post("/fleet/teams/vision/", form).status_code == 302
    vision = Team.objects.get(slug="vision")
    assert vision.name == "Vision!" and vision.department is None
    assert TeamPolicy.objects.get(team=vision).limit_priority == 80
    small = departments.create_department(BY, "small", "Small")
    from portal.tenancy import quotas
    quotas.replace_quotas(small, BY, [{"gpu_model": "*", "gpu_share": "1", "gpu_memory_gib": "1", "gpus": 1}])
    r = admin.post("/fleet/teams/vision/", form | {"name": "Vision?", "department": "small", "limit_priority": "70"})
    assert r.status_code == 400 and "its child vision 2.000 exceeds it" in error_of(r.content.decode(),
                                                                                    "id_department")
    vision.refresh_from_db()
    assert vision.name == "Vision!" and TeamPolicy.objects.get(team=vision).limit_priority == 80  # all or nothing


def test_the_navigation_marks_one_current_entry(research, browser_for):
    html = browser_for("admin").get("/fleet/departments/").content.decode()
    assert html.count('aria-current="page"') == 1
    assert re.search(r'<a href="/fleet/departments/" aria-current="page">Departments</a>', html)
