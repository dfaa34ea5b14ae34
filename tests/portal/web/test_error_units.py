"""Every error speaks the unit its field was typed in: hours, minutes and percent on the admin
pages (the services check seconds and fractions), GiB and hours on the request form (not Django's
"Ensure this value is less than or equal to 1024.")."""

from __future__ import annotations

import re

import pytest

from portal.audit import services as audit
from portal.tenancy import policy
from tests.portal.web.test_department_pages import error_of

POLICY = {"max_duration_h": "8", "interactive_max_h": "4", "idle_threshold_pct": "10", "idle_after_min": "15",
          "idle_action": "warn", "idle_warning_min": "20", "max_priority_member": "40", "max_priority_admin": "60"}



def _request_form(**overrides) -> dict:
    data = {"team": "vision", "kind": "interactive", "image": "busybox:1", "command": "", "gpu_model": "",
            "gpu_request": "0.3", "gpu_limit": "", "memory_gib": "4", "gpu_count": "1", "hours": "",
            "priority": "50"}
    return data | overrides


@pytest.mark.parametrize("overrides, field, message", [
    ({"memory_gib": "2000"}, "id_memory_gib", "At most 1024 GiB."),
    ({"gpu_count": "65"}, "id_gpu_count", "At most 64 GPUs."),
    ({"memory_gib": "lots"}, "id_memory_gib", "Type a number in GiB, e.g. 1.5."),
    ({"gpu_limit": "0"}, "id_gpu_limit", "At least 0.01 of a GPU."),
])
def test_request_form_errors_speak_the_fields_unit(fleet, browser_for, overrides, field, message):
    page = browser_for("alice").post("/reservations/new/", _request_form(**overrides)).content.decode()
    shown = re.search(rf'id="{field}".*?<p class="error" role="alert">(.*?)</p>', page, re.S)
    assert shown and shown.group(1) == message and "Ensure this value" not in page


@pytest.mark.parametrize("overrides, field, message", [
    ({"interactive_max_h": "10"}, "id_interactive_max_h",
     "the default duration (10 h) must not exceed the maximum duration (8 h)"),
    ({"idle_after_min": "0.5"}, "id_idle_after_min", "must be between 1 and 43200 min"),
    ({"idle_threshold_pct": "150"}, "id_idle_threshold_pct", "must be between 0 % and 100 %"),
])
def test_team_policy_errors_speak_hours_minutes_and_percent(fleet, browser_for, overrides, field, message):
    r = browser_for("carol").post("/team/vision/policy/", POLICY | overrides)
    assert r.status_code == 400
    assert error_of(r.content.decode(), field) == message


def test_policy_errors_against_the_site_limits_speak_the_pages_units(fleet, browser_for, teams, people):
    policy.set_limits(teams["vision"], audit.web(people["admin"]),
                      {"limit_duration_s": 6 * 3600, "limit_idle_after_s": 3600, "limit_idle_threshold": "0.05"})
    r = browser_for("carol").post("/team/vision/policy/", POLICY | {
        "max_duration_h": "8", "interactive_max_h": "4", "idle_after_min": "90", "idle_threshold_pct": "2"})
    html = r.content.decode()
    assert error_of(html, "id_max_duration_h") == "the site admins allow this team at most 6 h"
    assert error_of(html, "id_idle_after_min") == "the site admins want idle reservations acted on within 60 min"
    assert error_of(html, "id_idle_threshold_pct") == "the site admins set the lowest idle threshold to 5 %"


def test_preset_duration_error_speaks_hours(fleet, browser_for):
    browser_for("carol").post("/team/vision/policy/", POLICY)
    r = browser_for("carol").post("/team/vision/presets/", {
        "name": "Long", "kind": "interactive", "gpu_model": "", "gpu_request": "0.5", "gpu_limit": "",
        "gpu_memory_mib": "4096", "max_duration_h": "12", "image": "busybox:1", "command": ""})
    assert r.status_code == 400
    assert error_of(r.content.decode(), "id_max_duration_h") == "team vision&#x27;s policy allows at most 8 h"


def test_site_limit_errors_speak_minutes(fleet, browser_for, teams):
    form = {"name": "Vision", "department": "", "limit_duration_h": "48", "limit_priority": "80",
            "limit_idle_after_min": "0.5", "limit_idle_threshold_pct": "5", "limit_idle_warning_min": ""}
    r = browser_for("admin").post("/fleet/teams/vision/", form)
    assert r.status_code == 400
    assert error_of(r.content.decode(), "id_limit_idle_after_min") == "must be between 1 and 43200 min"
