"""Team policy (within the site admins' limits) and presets (checked like a request)."""

from decimal import Decimal

import pytest

from portal.audit import services as audit
from portal.audit.models import AuditEntry
from portal.errors import RuleViolation
from portal.reservations import presets
from portal.tenancy import policy
from portal.tenancy.models import Preset, TeamPolicy


def test_team_without_policy_row_has_permissive_defaults(teams, people):
    p = policy.policy_of(teams["vision"])
    assert p.max_priority("member") == 100 and p.max_priority("manager") == 0
    assert p.max_duration_s == 30 * 86400 and p.allow_over_quota is True
    assert not TeamPolicy.objects.exists()  # reading writes nothing


def test_team_admin_sets_policy_and_it_is_audited(teams, people):
    vision = teams["vision"]
    p = policy.set_policy(vision, audit.web(people["carol"]), {
        "max_priority_member": "40", "idle_threshold": "0.10", "idle_after_s": "900", "idle_reclaim": False,
        "max_duration_s": "7200", "interactive_max_s": "3600"})
    assert p.max_priority_member == 40 and p.idle_threshold == Decimal("0.100") and p.idle_after_s == 900
    assert policy.max_priority_for(people["alice"], vision) == 40
    assert policy.max_priority_for(people["admin"], vision) == 100
    entry = AuditEntry.objects.get(object_type="policy")
    assert entry.actor_label == "carol" and entry.via == "web" and entry.team == vision
    assert entry.before["max_priority_member"] == 100 and entry.after["max_priority_member"] == 40
    assert policy.request_problems(people["alice"], vision, priority=41, max_duration_s=7201) == {
        "priority": ["team vision lets you use priority up to 40; ask a team admin for more"],
        "max_duration_s": ["team vision allows at most 7200 s (2 h); ask for less"]}


def test_policy_beyond_site_limits_is_refused_and_nothing_written(teams, people):
    vision = teams["vision"]
    policy.set_limits(vision, audit.api(people["admin"]), {"limit_priority": 70, "limit_require_reclaim": True,
                                                           "limit_allow_over_quota": False})
    vision.refresh_from_db()
    assert vision.idle_reclaim is True and vision.allow_over_quota is False  # pushed to the new limits
    with pytest.raises(RuleViolation) as exc:
        policy.set_policy(vision, audit.web(people["carol"]), {
            "max_priority_member": 80, "idle_reclaim": False, "allow_over_quota": True, "idle_after_s": 600})
    assert set(exc.value.errors) == {"max_priority_member", "idle_reclaim", "allow_over_quota"}
    vision.refresh_from_db()
    assert vision.idle_after_s == 1800  # the valid part of a refused change is not written either
    assert policy.policy_of(vision).max_priority_member == 70


def test_default_duration_cannot_exceed_maximum(teams, people):
    with pytest.raises(RuleViolation) as exc:
        policy.set_policy(teams["vision"], audit.web(people["carol"]),
                          {"max_duration_s": 3600, "interactive_max_s": 7200})
    assert "must not exceed the maximum duration" in exc.value.errors["interactive_max_s"][0]


def test_preset_is_checked_like_a_request(fleet, teams, people):
    vision = teams["vision"]
    preset = presets.create_preset(vision, audit.web(people["carol"]), {
        "name": "Notebook", "gpu_model": "A100-80GB", "gpu_request": "0.25", "gpu_limit": "0.5",
        "gpu_memory_mib": 16384, "image": "jupyter/base-notebook:latest", "command": "jupyter lab"})
    assert preset.command == ["jupyter", "lab"] and preset.gpu_limit == Decimal("0.500")
    with pytest.raises(RuleViolation) as exc:
        presets.create_preset(vision, audit.web(people["carol"]), {
            "name": "Notebook", "gpu_model": "H100", "gpu_request": "0.25", "gpu_memory_mib": 16384,
            "image": "Not An Image"})
    assert "already has a preset 'Notebook'" in exc.value.errors["name"][0]
    with pytest.raises(RuleViolation) as exc:
        presets.create_preset(vision, audit.web(people["carol"]), {
            "name": "Big", "gpu_model": "T4", "gpu_request": "0.25", "gpu_memory_mib": 40000,
            "image": "Not An Image"})
    assert {"gpu_memory_mib", "image"} <= set(exc.value.errors)
    assert Preset.objects.count() == 1
    presets.update_preset(preset, audit.web(people["carol"]), {"gpu_request": "0.5"})
    presets.delete_preset(preset, audit.web(people["carol"]))
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == [
        "created", "changed", "deleted"]


def test_idle_warning_period_is_kept_within_the_site_admins_limit(teams, people):
    vision = teams["vision"]
    assert policy.policy_of(vision).idle_warning_s == 900  # 15 min unless the team says otherwise
    policy.set_policy(vision, audit.web(people["carol"]), {"idle_warning_s": 3600})
    policy.set_limits(vision, audit.api(people["admin"]), {"limit_idle_warning_s": 1800})
    vision.refresh_from_db()
    assert vision.idle_warning_s == 1800  # pushed down to the new limit
    with pytest.raises(RuleViolation) as exc:
        policy.set_policy(vision, audit.web(people["carol"]), {"idle_warning_s": 2400, "idle_after_s": 600})
    assert exc.value.errors == {"idle_warning_s": [
        "the site admins want idle reservations reclaimed within 1800 s of the warning"]}
    with pytest.raises(RuleViolation) as exc:
        policy.set_policy(vision, audit.web(people["carol"]), {"idle_warning_s": 30})
    assert exc.value.errors == {"idle_warning_s": ["must be between 60 and 86400"]}
    vision.refresh_from_db()
    assert (vision.idle_warning_s, vision.idle_after_s) == (1800, 1800)
    entries = AuditEntry.objects.filter(object_type="policy").order_by("id")
    assert entries.last().after["idle_warning_s"] == 1800 and entries.last().after["limit_idle_warning_s"] == 1800
