"""Inputs that answered 500: dates at the end of the calendar, NUL characters, a page number past
any integer column, and 'inf'/'nan' typed as numbers. Each is now refused with a 400 that names
the field and says what is wrong; none reaches the database or an arithmetic that overflows."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.reservations import presets
from portal.tenancy import policy

NUL = "a\x00b"
POLICY = {"max_duration_h": "", "interactive_max_h": "1", "idle_threshold_pct": "5", "idle_after_min": "30",
          "idle_action": "warn", "idle_warning_min": "15", "max_priority_member": "0", "max_priority_admin": "0"}
PRESET = {"name": "odd", "kind": "interactive", "gpu_request": "0.25", "gpu_memory_mib": "8192", "max_duration_h": "",
          "image": "busybox:1"}
LIMITS = {"name": "Vision", "limit_duration_h": "24", "limit_priority": "10", "limit_idle_threshold_pct": "5"}

# (who, method, path, data, the words the answer must hold). JSON answers must also name the field.
FOUND = [  # the fourteen of the audit
    ("dave", "get", "/api/v1/reports/usage/", {"until": "9999-12-31"}, "out of range"),
    ("dave", "get", "/api/v1/reports/overview/", {"until": "9999-12-31"}, "out of range"),
    ("dave", "get", "/reports/", {"until": "9999-12-31"}, "out of range"),
    ("dave", "get", "/reports/overview/", {"until": "9999-12-31"}, "out of range"),
    ("admin", "get", "/api/v1/audit/", {"until": "9999-12-31"}, "out of range"),
    ("admin", "get", "/audit/", {"until": "9999-12-31"}, "out of range"),
    ("admin", "get", "/api/v1/audit/", {"object_id": NUL}, "Null characters"),
    ("admin", "get", "/audit/", {"object_id": NUL}, "Null characters"),
    ("admin", "get", "/api/v1/audit/", {"user": NUL}, "Null characters"),
    ("admin", "get", "/audit/", {"user": NUL}, "Null characters"),
    ("admin", "get", "/audit/", {"page": "99999999999999999999"}, "narrow the dates"),
    ("carol", "post", "/team/vision/policy/", {**POLICY, "max_duration_h": "inf"}, "a number of hours"),
    ("carol", "post", "/team/vision/presets/", {**PRESET, "gpu_request": "nan"}, "must be a decimal number"),
    ("admin", "post", "/fleet/teams/vision/", {**LIMITS, "limit_duration_h": "inf"}, "a number (hours)"),
]
SIBLINGS = [  # the same causes, elsewhere
    ("dave", "get", "/api/v1/reports/usage/", {"since": "0001-01-01", "until": "0001-01-02", "tz": "Europe/Paris"},
     "out of range"),
    ("dave", "get", "/api/v1/reports/usage/", {"until": "0001-01-02"}, "out of range"),
    ("dave", "get", "/api/v1/reports/usage/", {"until": "9999-12-31T23:00", "tz": "America/New_York"},
     "out of range"),
    ("dave", "get", "/reports/", {"until": "0001-01-01"}, "out of range"),
    ("admin", "get", "/api/v1/audit/", {"team": NUL}, "Null characters"),
    ("admin", "get", "/api/v1/audit/", {"object_type": NUL}, "Null characters"),
    ("admin", "get", "/api/v1/audit/", {"since": "0001-01-01"}, "out of range"),
    ("admin", "get", "/audit/", {"page": "x"}, "a page number"),
    ("carol", "post", "/team/vision/policy/", {**POLICY, "interactive_max_h": "inf"}, "a number of hours"),
    ("carol", "post", "/team/vision/policy/", {**POLICY, "idle_threshold_pct": "nan"}, "a percentage"),
    ("carol", "post", "/team/vision/policy/", {**POLICY, "idle_after_min": "inf"}, "a number of minutes"),
    ("carol", "post", "/team/vision/policy/", {**POLICY, "idle_warning_min": "inf"}, "a number of minutes"),
    ("carol", "post", "/team/vision/policy/", {**POLICY, "reclaim_grace_min": "inf"}, "a number of minutes"),
    ("carol", "post", "/team/vision/policy/", {**POLICY, "max_duration_h": "1e308"}, "a number of hours"),
    ("carol", "post", "/team/vision/presets/", {**PRESET, "max_duration_h": "inf"}, "a number of hours"),
    ("carol", "post", "/team/vision/presets/", {**PRESET, "gpu_limit": "nan"}, "must be a decimal number"),
    ("admin", "post", "/fleet/teams/vision/", {**LIMITS, "limit_duration_h": "1e400"}, "a number (hours)"),
    ("admin", "post", "/fleet/teams/vision/", {**LIMITS, "limit_idle_threshold_pct": "nan"}, "a percentage"),
    ("admin", "post", "/fleet/teams/vision/", {**LIMITS, "limit_idle_after_min": "inf"}, "a number (minutes)"),
    ("admin", "post", "/fleet/teams/vision/", {**LIMITS, "limit_idle_warning_min": "inf"}, "a number (minutes)"),
    ("admin", "get", "/fleet/", {"model": NUL}, "NUL character"),
    ("admin", "get", "/fleet/", {"node": NUL}, "NUL character"),
    ("admin", "get", "/fleet/rows/", {"ids": "1", "next": "/fleet/?model=a%00b"}, "NUL character"),
    ("carol", "get", "/team/", {"team": NUL}, "short name"),
]


def _ask(people, who, method, path, data):
    client = Client(raise_request_exception=False)
    client.force_login(people[who])
    return client.get(path, data) if method == "get" else client.post(path, data)


@pytest.mark.parametrize(("who", "method", "path", "data", "words"), FOUND + SIBLINGS,
                         ids=[f"{c[2]}-{'-'.join(f'{k}={v!r}' for k, v in c[3].items() if v not in ('', 'Vision'))}"
                              for c in FOUND + SIBLINGS])
def test_odd_input_is_a_400_that_says_why(people, fleet, who, method, path, data, words):
    r = _ask(people, who, method, path, data)
    assert r.status_code == 400, (r.status_code, r.content[:300])
    text = r.content.decode()
    assert words in text, text[:2000]
    if r["Content-Type"].startswith("application/json"):
        assert set(data) & set(r.json()), r.json()  # the field is named


def test_fourteen_were_found():
    assert len(FOUND) == 14


@pytest.mark.parametrize("value", ["NaN", "nan", "sNaN", "Infinity", "-inf"])
def test_the_policy_service_refuses_numbers_that_are_not_finite(teams, value):
    for write, name in ((policy.set_policy, "idle_threshold"), (policy.set_limits, "limit_idle_threshold")):
        with pytest.raises(RuleViolation) as refused:
            write(teams["vision"], audit.cli(), {name: value})
        assert "decimal number" in refused.value.errors[name][0]


@pytest.mark.parametrize("field", ["gpu_request", "gpu_limit"])
@pytest.mark.parametrize("value", ["NaN", "sNaN", "Infinity"])
def test_the_preset_rules_refuse_numbers_that_are_not_finite(teams, fleet, field, value):
    with pytest.raises(RuleViolation) as refused:
        presets.create_preset(teams["vision"], audit.cli(), {
            **{k: v for k, v in PRESET.items() if k != "max_duration_h"}, field: value})
    assert "decimal number" in refused.value.errors[field][0]


def test_filters_that_are_fine_still_answer(people, fleet):
    assert _ask(people, "admin", "get", "/audit/", {"since": "2026-01-01", "until": "2026-02-01", "page": "2",
                                                    "object_id": "99999999999999999999"}).status_code == 200
    assert _ask(people, "admin", "get", "/api/v1/audit/", {"since": "1970-01-01", "until": "9998-12-31"}
                ).status_code == 200
    assert _ask(people, "dave", "get", "/api/v1/reports/usage/", {"since": "2026-01-01", "until": "2026-01-31"}
                ).status_code == 200
