"""A backwards date range keeps both days as typed and says what is wrong, on the report pages,
the reports API and the audit log."""

from __future__ import annotations

import re

from django.test import Client


def _browser(people, who="admin") -> Client:
    client = Client()
    client.force_login(people[who])
    return client


def test_report_page_keeps_both_days_and_says_the_range_is_backwards(fleet, people):
    r = _browser(people).get("/reports/", {"since": "2026-11-20", "until": "2026-11-10"})
    html = r.content.decode()
    assert r.status_code == 400
    assert re.search(r'id="f-since"[^>]*value="2026-11-20"[^>]*aria-invalid="true"', html)
    assert re.search(r'id="f-until"[^>]*value="2026-11-10"[^>]*aria-invalid="true"', html)
    assert "From: the window ends before it starts: 2026-11-20 is after 2026-11-10; give the earlier day first" in html


def test_reports_api_names_the_backwards_range(client_for, fleet):
    r = client_for("admin").get("/api/v1/reports/usage/", {"since": "2026-11-20", "until": "2026-11-10"})
    assert r.status_code == 400
    assert "2026-11-20 is after 2026-11-10" in str(r.json())


def test_audit_page_keeps_both_days_and_says_the_range_is_backwards(fleet, people):
    r = _browser(people).get("/audit/", {"since": "2026-11-20", "until": "2026-11-10"})
    html = r.content.decode()
    assert r.status_code == 400
    assert re.search(r'id="a-since"[^>]*value="2026-11-20"', html) and 'value="2026-11-10"' in html
    assert "From: the range ends before it starts: 2026-11-20 is after 2026-11-10" in html
