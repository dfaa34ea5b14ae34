"""The usage report grouped by reservation: one CSV column per fact (id, name, owner, team, GPU
model, start, end), not one packed label; the JSON rows carry the same fields."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from tests.portal.test_reports import T0, URL, two_hours  # noqa: F401 (a fixture)


def test_reservation_csv_has_one_column_per_fact(client_for, two_hours):  # noqa: F811
    vision, nlp = two_hours["vision"], two_hours["nlp"]
    params = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=4)).isoformat(),
              "group_by": "reservation", "tz": "Europe/Paris"}
    r = client_for("admin").get(URL, {**params, "format": "csv"})
    assert r.status_code == 200, r.content
    header, *rows = list(csv.reader(io.StringIO(r.content.decode())))
    assert header[:8] == ["reservation id", "name", "owner", "team", "GPU model", "start (Europe/Paris)",
                          "end (Europe/Paris)", "allocated (GPU-hours)"]
    by_id = {row[0]: row for row in rows}
    assert by_id[str(vision.pk)][1:8] == ["", "alice", "vision", "T4", "2026-11-02 09:00:00", "2026-11-02 11:00:00",
                                          "1.0"]
    assert by_id[str(nlp.pk)][2:7] == ["bob", "nlp", "T4", "2026-11-02 09:00:00", "2026-11-02 10:00:00"]
    assert rows[-1][:8] == ["Total", "", "", "", "", "", "", "2.0"]
    row = next(x for x in client_for("admin").get(URL, params).json()["rows"] if x["key"] == str(vision.pk))
    assert row["reservation"]["id"] == vision.pk and row["reservation"]["owner"] == "alice"
    assert row["reservation"]["gpu_model"] == "T4" and row["reservation"]["finished_at"] is not None


def test_a_team_without_use_is_listed_with_zeros(client_for, two_hours, teams, people):  # noqa: F811
    from portal.tenancy.models import Quota, Team

    quiet = Team.objects.create(slug="quiet", name="Quiet")  # no quota, held nothing, lent nothing
    Quota.objects.filter(team=quiet).delete()
    params = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=4)).isoformat()}
    rows = {r["key"]: r for r in client_for("admin").get(URL, params).json()["rows"]}
    assert set(rows) == {"vision", "nlp", "quiet"}
    assert rows["quiet"]["allocated_gpu_hours"] == 0 and rows["quiet"]["used_gpu_hours"] == 0
    assert rows["quiet"]["used_pct"] is None
    table = list(csv.reader(io.StringIO(client_for("admin").get(URL, {**params, "format": "csv"}).content.decode())))
    assert table[[r[0] for r in table].index("quiet")][:4] == ["quiet", "0.0", "0.0", ""]
    from django.test import Client

    browser = Client()
    browser.force_login(people["admin"])
    page = browser.get("/reports/", params).content.decode()
    assert '<tr data-key="quiet">' in page
