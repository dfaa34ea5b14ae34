"""The workloads page: a manager's or team admin's list of their teams' reservations, its
filters, sort, pages, CSV, and the cancel and extend actions their role allows."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from django.test import Client

from portal.reservations.models import Reservation
from tests.reservations import clock_at, ended, running, submitted

pytestmark = pytest.mark.django_db


def client(people, who: str) -> Client:
    c = Client()
    c.force_login(people[who])
    return c


def gpu(fleet, node: str, index: int):
    return fleet.get(node__name=node, index=index)


@pytest.fixture
def work(fleet, teams, people):
    """vision: alice running a share on t4-node-1/0 (made 2026-11-02), carol pending (2026-11-05),
    alice's finished one (2026-11-01); nlp: bob running on t4-node-1/1."""
    v, n = teams["vision"], teams["nlp"]
    with clock_at(datetime(2026, 11, 1, 9, tzinfo=UTC)):
        old = submitted(people["alice"], v, gpu_request="0.5", gpu_memory_mib=4096)
        ended(running(old, gpu(fleet, "t4-node-1", 0)))
    with clock_at(datetime(2026, 11, 2, 9, tzinfo=UTC)):
        train = running(submitted(people["alice"], v, name="train", gpu_request="0.25", gpu_memory_mib=8192,
                                  max_duration_s=3600), gpu(fleet, "t4-node-1", 0))
    with clock_at(datetime(2026, 11, 5, 9, tzinfo=UTC)):
        waiting = submitted(people["carol"], v, name="sweep", gpu_request="1.0", gpu_memory_mib=1024)
    other = running(submitted(people["bob"], n, name="nlp-job", gpu_request="0.5", gpu_memory_mib=2048),
                    gpu(fleet, "t4-node-1", 1))
    return {"old": old, "train": train, "waiting": waiting, "other": other}


def ids(response) -> list[int]:
    html = response.content.decode()
    return [int(x) for x in __import__("re").findall(r'data-reservation="(\d+)"', html)]


def test_manager_sees_their_teams_reservations_only(work, people):
    r = client(people, "dave").get("/workloads/")
    assert r.status_code == 200
    assert ids(r) == [work["waiting"].pk, work["train"].pk, work["old"].pk]  # newest first
    assert work["other"].pk not in ids(r)
    assert "Extend" not in r.content.decode()  # managers look, team admins act


@pytest.mark.parametrize("who", ["alice", "bob"])
def test_members_are_refused(work, people, who):
    assert client(people, who).get("/workloads/").status_code == 403


def test_site_admin_sees_every_team(work, people):
    assert set(ids(client(people, "admin").get("/workloads/"))) == {w.pk for w in work.values()}


def test_another_teams_filter_is_404(work, people):
    assert client(people, "dave").get("/workloads/", {"team": "nlp"}).status_code == 404


def test_filters_by_user_state_model_and_dates(work, people):
    c = client(people, "carol")
    assert ids(c.get("/workloads/", {"user": "carol"})) == [work["waiting"].pk]
    assert ids(c.get("/workloads/", {"state": "running"})) == [work["train"].pk]
    assert ids(c.get("/workloads/", {"state": "active"})) == [work["waiting"].pk, work["train"].pk]
    assert ids(c.get("/workloads/", {"gpu_model": "T4"})) == [work["train"].pk, work["old"].pk]
    # Made before 3 November and not ended before 2 November: the running one, not the one that ended on the 1st.
    assert ids(c.get("/workloads/", {"since": "2026-11-02", "until": "2026-11-03"})) == [work["train"].pk]


def test_backwards_dates_are_an_error_that_keeps_both_dates(work, people):
    r = client(people, "carol").get("/workloads/", {"since": "2026-11-05", "until": "2026-11-01"})
    assert r.status_code == 400
    html = r.content.decode()
    assert "the end date 2026-11-01 is before the start date 2026-11-05" in html
    assert 'value="2026-11-05"' in html and 'value="2026-11-01"' in html
    assert ids(r) == []


def test_a_date_that_is_no_date_says_so(work, people):
    r = client(people, "carol").get("/workloads/", {"since": "yesterday"})
    assert r.status_code == 400 and "&#x27;yesterday&#x27; is not a date such as 2026-11-16" in r.content.decode()


def test_sort_by_share_both_ways(work, people):
    c = client(people, "carol")
    assert ids(c.get("/workloads/", {"sort": "share"})) == [work["train"].pk, work["old"].pk, work["waiting"].pk]
    assert ids(c.get("/workloads/", {"sort": "-share"})) == [work["waiting"].pk, work["old"].pk, work["train"].pk]
    assert c.get("/workloads/", {"sort": "password"}).status_code == 400


def test_pages_of_fifty(fleet, teams, people):
    for i in range(53):
        submitted(people["alice"], teams["vision"], name=f"job-{i}", gpu_request="0.1", gpu_memory_mib=512)
    c = client(people, "carol")
    first, second = c.get("/workloads/"), c.get("/workloads/", {"page": 2})
    assert len(ids(first)) == 50 and len(ids(second)) == 3
    assert not set(ids(first)) & set(ids(second))
    assert "Page 2 of 2" in second.content.decode()


def test_htmx_gets_only_the_table(work, people):
    r = client(people, "carol").get("/workloads/", {"user": "alice"}, HTTP_HX_REQUEST="true")
    html = r.content.decode()
    assert "<html" not in html and 'id="workload-filters"' not in html
    assert ids(r) == [work["train"].pk, work["old"].pk]


def test_csv_has_one_column_per_fact(work, people):
    r = client(people, "carol").get("/workloads/", {"format": "csv", "sort": "id"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.content.decode())))
    assert rows[0] == ["id", "team", "user", "name", "state", "GPU model", "share (% of a GPU)",
                       "memory (GiB per GPU)", "node", "GPU", "created (UTC)", "started (UTC)", "ended (UTC)"]
    by_id = {int(line[0]): line for line in rows[1:]}
    assert set(by_id) == {work["old"].pk, work["train"].pk, work["waiting"].pk}
    train = by_id[work["train"].pk]
    assert train[1:6] == ["vision", "alice", "train", "running", "T4"]
    assert train[6:10] == ["25.0", "8.0", "t4-node-1", "t4-node-1/0"]
    assert train[10] == "2026-11-02T09:00:00Z" and train[11] and train[12] == ""
    assert by_id[work["old"].pk][3] == "" and by_id[work["old"].pk][12]
    assert by_id[work["waiting"].pk][8:10] == ["", ""]


def test_team_admin_cancels_and_extends_from_the_page(work, people):
    c = client(people, "carol")
    before = Reservation.objects.get(pk=work["train"].pk).expires_at
    r = c.post(f"/workloads/{work['train'].pk}/extend/", {"hours": "0.5", "back": "?state=running"})
    assert r.status_code == 302 and r["Location"] == "/workloads/?state=running"
    assert (Reservation.objects.get(pk=work["train"].pk).expires_at - before).total_seconds() == 1800
    r = c.post(f"/workloads/{work['waiting'].pk}/cancel/", {"back": "//evil.example/"})
    assert r.status_code == 302 and r["Location"] == "/workloads/"
    assert Reservation.objects.get(pk=work["waiting"].pk).state == "cancelled"


def test_extend_in_hours_refused_in_hours(work, people):
    c = client(people, "carol")
    r = c.post(f"/workloads/{work['train'].pk}/extend/", {"hours": "0.1"}, follow=True)
    assert "Add at least a quarter of an hour (0.25)." in r.content.decode()


def test_manager_may_not_act(work, people):
    c = client(people, "dave")
    assert c.post(f"/workloads/{work['train'].pk}/cancel/").status_code == 403
    assert c.post(f"/workloads/{work['train'].pk}/extend/", {"hours": "1"}).status_code == 403
    assert Reservation.objects.get(pk=work["train"].pk).state == "running"


def test_another_teams_reservation_is_404(work, people):
    c = client(people, "carol")
    assert c.post(f"/workloads/{work['other'].pk}/cancel/").status_code == 404
    assert c.post(f"/workloads/{work['other'].pk}/extend/", {"hours": "1"}).status_code == 404
    assert Reservation.objects.get(pk=work["other"].pk).state == "running"


def test_navigation_shows_workloads_to_managers_only(work, people):
    assert 'href="/workloads/"' in client(people, "dave").get("/").content.decode()
    assert 'href="/workloads/"' not in client(people, "alice").get("/").content.decode()


def api(people, who: str):
    from rest_framework.test import APIClient

    c = APIClient()
    c.force_authenticate(people[who])
    return c


def test_the_api_lists_the_same_workloads_with_the_same_filters(work, people):
    r = api(people, "dave").get("/api/v1/workloads/", {"state": "active", "sort": "id"})
    assert r.status_code == 200
    body = r.json()
    assert [w["id"] for w in body["results"]] == sorted([work["train"].pk, work["waiting"].pk])
    train = body["results"][0]
    assert train | {"created": None, "started": None} == {
        "id": work["train"].pk, "team": "vision", "user": "alice", "name": "train", "state": "running",
        "gpu_model": "T4", "share_pct": 25.0, "memory_gib": 8.0, "node": "t4-node-1", "gpus": ["t4-node-1/0"],
        "created": None, "started": None, "ended": None}


def test_the_api_refuses_what_the_page_refuses(work, people):
    assert api(people, "alice").get("/api/v1/workloads/").status_code == 403
    assert api(people, "dave").get("/api/v1/workloads/", {"team": "nlp"}).status_code == 404
    r = api(people, "dave").get("/api/v1/workloads/", {"since": "2026-11-05", "until": "2026-11-01"})
    assert r.status_code == 400 and "is before the start date 2026-11-05" in r.json()["until"][0]
    assert api(people, "dave").get("/api/v1/workloads/", {"stat": "running"}).status_code == 400
