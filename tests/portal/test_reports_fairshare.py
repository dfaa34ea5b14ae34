"""The usage report's fair-share columns, hand-computed: quota GPU-hours (current quota rows × the
window's hours), borrowed GPU-hours (by admission) and lent GPU-hours (what siblings held beyond
their quotas, split among the others' unused quota in proportion), per team and per department;
JSON, CSV and page from one answer; managers see only their teams' rows."""

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from portal.audit import services as audit
from portal.fleet.models import Gpu
from portal.tenancy import departments, quotas
from portal.tenancy.models import Membership, Quota, Role
from tests.reservations import clock_at, ended, placed, submitted
from tests.teams import make_team

URL = "/api/v1/reports/usage/"
T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
WINDOW = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=4)).isoformat()}  # 5 h
BY = audit.cli("test")
A100 = "A100-80GB"


def a100(i: int) -> Gpu:
    return Gpu.objects.filter(model=A100).order_by("node__name", "index")[i]


def hold(people, teams, who, team, gpu, share, start, end, admission="guaranteed"):
    with clock_at(start):
        r = placed(submitted(people[who], teams[team], image="busybox:1", gpu_request=share, gpu_limit=share,
                             gpu_memory_mib=1024, gpu_model=A100), gpu, admission=admission)
    with clock_at(end):
        ended(r)
    return r


@pytest.fixture
def nlp_borrows(fleet, teams, people):
    """vision (quota 2.0) holds nothing; nlp (quota 1.5) holds 1.5 for 2 hours from T0 and 1.0 more,
    borrowed, for the first hour: 1.0 beyond its quota, taken from vision's unused 2.0."""
    hold(people, teams, "bob", "nlp", a100(0), "1.0", T0, T0 + timedelta(hours=2))
    hold(people, teams, "bob", "nlp", a100(1), "0.5", T0, T0 + timedelta(hours=2))
    hold(people, teams, "bob", "nlp", a100(2), "1.0", T0, T0 + timedelta(hours=1), admission="borrowed")


def rows(data):
    return {r["key"]: r for r in data["rows"]}


def test_quota_used_borrowed_and_lent_hours_per_team(client_for, nlp_borrows):
    data = client_for("admin").get(URL, WINDOW).json()
    vision, nlp = rows(data)["vision"], rows(data)["nlp"]
    assert nlp["quota_gpu_hours"] == 7.5 and vision["quota_gpu_hours"] == 10.0  # 1.5 and 2.0 × 5 h
    assert nlp["allocated_gpu_hours"] == 4.0 and nlp["borrowed_gpu_hours"] == 1.0
    assert vision["lent_gpu_hours"] == 1.0 and nlp["lent_gpu_hours"] == 0
    assert data["total"]["quota_gpu_hours"] == 17.5 and data["total"]["lent_gpu_hours"] == 1.0
    assert "current quota rows" in data["quota_rule"] and "in proportion" in data["lent_rule"]


def test_lent_is_split_in_proportion_to_unused_quota_up_to_lending_limits(client_for, fleet, teams, people):
    audio = make_team("audio", quota_gpu_share=Decimal("2.0"))
    Membership.objects.create(user=people["bob"], team=audio, role=Role.MEMBER)
    # nlp holds 1.5 beyond its quota for an hour; vision leaves 2.0 unused and audio 1.0 (it holds 1.0).
    hold(people, teams, "bob", "nlp", a100(0), "1.0", T0, T0 + timedelta(hours=1))
    hold(people, teams, "bob", "nlp", a100(1), "0.5", T0, T0 + timedelta(hours=1))
    hold(people, teams, "bob", "nlp", a100(2), "1.0", T0, T0 + timedelta(hours=1), admission="borrowed")
    hold(people, teams, "bob", "nlp", a100(3), "0.5", T0, T0 + timedelta(hours=1), admission="borrowed")
    hold(people, {"audio": audio}, "bob", "audio", a100(4), "1.0", T0, T0 + timedelta(hours=1))
    lent = {k: r["lent_gpu_hours"] for k, r in rows(client_for("admin").get(URL, WINDOW).json()).items()}
    assert lent == {"vision": 1.0, "audio": 0.5, "nlp": 0}  # 1.5 split 2 : 1
    # vision lends at most 0.5: audio's unused quota covers the rest (1.0), as far as it goes.
    row = Quota.objects.get(team=teams["vision"], gpu_model="*")
    quotas.replace_quotas(teams["vision"], BY, [{
        "gpu_model": "*", "gpu_share": row.gpu_share, "gpu_memory_gib": row.gpu_memory_gib, "gpus": row.gpus,
        "lending_limit": {"gpu_share": "0.5"}}])
    lent = {k: r["lent_gpu_hours"] for k, r in rows(client_for("admin").get(URL, WINDOW).json()).items()}
    assert lent["vision"] == pytest.approx(0.5) and lent["audio"] == pytest.approx(1.0)


def test_hours_without_borrowing_lend_nothing(client_for, fleet, teams, people):
    hold(people, teams, "bob", "nlp", a100(0), "1.0", T0, T0 + timedelta(hours=3))
    hold(people, teams, "bob", "nlp", a100(1), "0.5", T0, T0 + timedelta(hours=3))
    data = client_for("admin").get(URL, WINDOW).json()
    assert rows(data)["vision"]["lent_gpu_hours"] == 0 and data["total"]["lent_gpu_hours"] == 0


@pytest.fixture
def research(nlp_borrows, teams):
    """Department research (no rows of its own: it counts as its teams) holding vision and nlp, and
    department empty-lab above nothing of theirs."""
    departments.create_department(BY, "research", "Research")
    departments.create_department(BY, "empty-lab", "Empty lab")
    for team in teams.values():
        departments.move_team(team, BY, "research")


def test_grouped_by_department(client_for, research):
    data = client_for("admin").get(URL, {**WINDOW, "group_by": "department"}).json()
    assert data["group_by"] == "department" and [r["key"] for r in data["rows"]] == ["research"]
    research = data["rows"][0]
    assert research["label"] == "Research" and research["allocated_gpu_hours"] == 4.0
    assert research["borrowed_gpu_hours"] == 1.0
    assert research["quota_gpu_hours"] == 17.5  # no rows: what its teams claim, 3.5 × 5 h
    assert research["lent_gpu_hours"] == 1.0  # lent through its teams (vision to nlp)
    teams = rows(client_for("admin").get(URL, WINDOW).json())
    assert teams["vision"]["department"] == "Research" and teams["nlp"]["department"] == "Research"


def test_a_department_with_rows_counts_its_own_quota_and_lending(client_for, research, teams, fleet, people):
    lab = departments.create_department(BY, "lab", "Lab")
    quotas.replace_quotas(lab, BY, [{"gpu_model": "*", "gpu_share": "3", "gpu_memory_gib": "300", "gpus": 6}])
    research_row = {"gpu_model": "*", "gpu_share": "4", "gpu_memory_gib": "400", "gpus": 8}
    quotas.replace_quotas(departments.Department.objects.get(slug="research"), BY, [research_row])
    data = client_for("admin").get(URL, {**WINDOW, "group_by": "department"}).json()
    research = rows(data)["research"]
    assert research["quota_gpu_hours"] == 20.0  # its own row: 4 × 5 h
    assert research["lent_gpu_hours"] == 0  # it lent nothing to lab: nothing beyond research's own quota
    assert "lab" not in rows(data)  # none of the report's teams is under it


def test_managers_see_their_teams_departments_only(client_for, research):
    data = client_for("dave").get(URL, {**WINDOW, "group_by": "department"}).json()
    assert [r["key"] for r in data["rows"]] == ["research"]
    assert data["rows"][0]["allocated_gpu_hours"] == 0  # nlp's hours are not dave's to see
    assert data["total"]["quota_gpu_hours"] == 10.0 and data["total"]["lent_gpu_hours"] == 1.0  # vision's
    assert set(rows(client_for("dave").get(URL, WINDOW).json())) == {"vision"}


def test_teams_without_a_department_group_together(client_for, nlp_borrows):
    data = client_for("admin").get(URL, {**WINDOW, "group_by": "department"}).json()
    (row,) = data["rows"]
    assert row["label"] == "(no department)" and row["allocated_gpu_hours"] == 4.0 and row["quota_gpu_hours"] == 17.5


def test_csv_has_the_same_quota_columns_as_json(client_for, research):
    client = client_for("admin")
    for group_by, first in (("team", "team"), ("department", "department")):
        data = client.get(URL, {**WINDOW, "group_by": group_by}).json()
        table = list(csv.reader(io.StringIO(client.get(URL, {**WINDOW, "group_by": group_by,
                                                              "format": "csv"}).content.decode())))
        header = table[0]
        assert header[0] == first
        quota, lent = header.index("quota (GPU-hours, current quota rows)"), header.index("lent to others (GPU-hours)")
        by_label = {line[0]: line for line in table[1:]}
        for r in data["rows"] + [data["total"]]:
            line = by_label[r["label"]]
            assert float(line[quota]) == r["quota_gpu_hours"] and float(line[lent]) == r["lent_gpu_hours"]
    # Other groupings have no quota columns.
    header = next(csv.reader(io.StringIO(client.get(URL, {**WINDOW, "group_by": "node", "format": "csv"})
                                         .content.decode())))
    assert "lent to others (GPU-hours)" not in header


def test_the_page_shows_the_columns_and_says_how_they_are_counted(client_for, people, research):
    from django.test import Client

    browser = Client()
    browser.force_login(people["admin"])
    html = browser.get("/reports/", {**WINDOW, "group_by": "department"}).content.decode()
    assert "<th scope=\"col\">Department</th>" in html and 'data-quota>17.50</td>' in html
    assert 'data-lent>1.00</td>' in html
    assert "current quota rows" in html and "in proportion to what each left unused" in html
    html = browser.get("/reports/", WINDOW).content.decode()
    assert 'class="muted unit-path">Research</small>' in html


def test_lending_off_the_hour_counts_its_minutes(client_for, fleet, teams, people):
    # nlp's own 1.5 runs all along; 1.0 more, borrowed, for 20 minutes from 08:07.
    hold(people, teams, "bob", "nlp", a100(0), "1.0", T0 - timedelta(minutes=30), T0 + timedelta(hours=2))
    hold(people, teams, "bob", "nlp", a100(1), "0.5", T0 - timedelta(minutes=30), T0 + timedelta(hours=2))
    hold(people, teams, "bob", "nlp", a100(2), "1.0", T0 + timedelta(minutes=7), T0 + timedelta(minutes=27),
         admission="borrowed")
    data = client_for("admin").get(URL, WINDOW).json()
    assert rows(data)["vision"]["lent_gpu_hours"] == pytest.approx(20 / 60, abs=1e-3)
    assert rows(data)["nlp"]["borrowed_gpu_hours"] == pytest.approx(20 / 60, abs=1e-3)


@pytest.mark.parametrize(("span", "slot"), [(timedelta(hours=24), 5), (timedelta(days=7), 15),
                                            (timedelta(days=30), 60), (timedelta(days=400), 800)])
def test_lending_is_worked_out_on_at_most_720_slots(span, slot):
    from portal.reports.fairshare import MAX_SLOTS, slot_length

    assert slot_length(T0, T0 + span) == timedelta(minutes=slot)
    assert span / slot_length(T0, T0 + span) <= MAX_SLOTS
