"""The reports pages: who may open them, what they show, and that their numbers and CSV link are
the API's."""

import re
from datetime import timedelta

import pytest
from django.test import Client

from .test_reports import T0, busy, gpu, hold, use


@pytest.fixture
def history(fleet, teams, people):
    t4_0, t4_1 = gpu("t4-node-1", 0), gpu("t4-node-1", 1)
    vision = hold(people, teams, "alice", "vision", t4_0, "0.25", T0, T0 + timedelta(hours=1), limit="1.0")
    hold(people, teams, "bob", "nlp", t4_1, "1.0", T0, T0 + timedelta(hours=1))
    use(vision, t4_0, T0, 60, 0.5)  # bursts to twice its request
    busy(t4_0, T0, 60, 50)
    return vision


def page(people, who, url, **params):
    client = Client()
    client.force_login(people[who])
    return client.get(url, params)


WINDOW = {"since": "2026-11-02", "until": "2026-11-02"}


def test_manager_sees_the_usage_report_of_their_team(history, people):
    r = page(people, "dave", "/reports/", **WINDOW)
    assert r.status_code == 200
    html = r.content.decode()
    assert 'data-key="vision"' in html and 'data-key="nlp"' not in html
    assert re.search(r'class="num pct">200\.0 %', html)  # burst above the request, explained
    assert "shares burst above their request" in html
    assert "/api/v1/reports/usage/?" in html and "format=csv" in html
    assert 'type="date"' in html and 'value="2026-11-02"' in html


def test_overview_page(history, people):
    r = page(people, "dave", "/reports/overview/", **WINDOW)
    assert r.status_code == 200
    html = r.content.decode()
    assert "Stranded" in html and "Queueing delay" in html and 'id="series-data"' in html


@pytest.mark.parametrize("who", ["alice", "bob"])
@pytest.mark.parametrize("url", ["/reports/", "/reports/overview/"])
def test_members_cannot_open_reports(history, people, who, url):
    assert page(people, who, url).status_code == 403


def test_another_teams_report_is_404(history, people):
    assert page(people, "dave", "/reports/", team="nlp").status_code == 404
    assert page(people, "admin", "/reports/", team="nlp").status_code == 200


def test_a_bad_date_says_what_is_wrong(history, people):
    r = page(people, "dave", "/reports/", since="31/12/2026")
    assert r.status_code == 400 and b"is not a date" in r.content


def test_pages_have_no_inline_script(history, people):
    for url in ("/reports/", "/reports/overview/"):
        html = page(people, "admin", url, **WINDOW).content.decode()
        for tag in re.findall(r"<script[^>]*>", html):
            assert "src=" in tag or 'type="application/json"' in tag, tag
        assert " style=" not in html


def test_navigation_shows_reports_to_managers_only(history, people):
    assert b'href="/reports/overview/"' in page(people, "dave", "/reports/").content
    home = page(people, "alice", "/")
    assert b'href="/reports/overview/"' not in home.content
