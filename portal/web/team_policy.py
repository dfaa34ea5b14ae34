"""A team's policy (/team/<slug>/policy/): durations, idle handling, priorities, over-quota and
remote use, reclaim grace, booking no-shows; typed in hours, minutes and percent."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.tenancy import policy
from portal.tenancy.models import TeamPolicy

from .numbers import finite, hours_text, seconds_from_hours, whole_seconds
from .team_admin import page, team_of
from .units import page_errors


@login_required
def policy_page(request, slug: str):
    team = team_of(request, slug)
    current = policy.policy_of(team)
    row = TeamPolicy.objects.filter(team=team).first()
    row_max = row.max_duration_s if row else None  # blank: the site limit applies
    form = {
        "max_duration_h": hours_text(row_max), "interactive_max_h": hours_text(current.interactive_max_s),
        "idle_threshold_pct": f"{float(current.idle_threshold) * 100:g}",
        "idle_after_min": f"{current.idle_after_s / 60:g}",
        "idle_action": "reclaim" if current.idle_reclaim else "warn",
        "idle_warning_min": f"{current.idle_warning_s / 60:g}",
        "max_priority_member": current.max_priority_member, "max_priority_admin": current.max_priority_admin,
        "allow_over_quota": current.allow_over_quota, "allow_remote": current.allow_remote,
        "connect_admins": current.connect_admins,
        "reclaim_grace_min": f"{current.reclaim_grace_s / 60:g}",
        "booking_no_show_min": current.booking_no_show_min,
    }
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form}
        form["allow_over_quota"] = request.POST.get("allow_over_quota") == "on"
        form["allow_remote"] = request.POST.get("allow_remote") == "on"
        form["connect_admins"] = request.POST.get("connect_admins") == "on"
        changes: dict = {
            "max_duration_s": seconds_from_hours(form["max_duration_h"], "max_duration_s", errors),
            "interactive_max_s": seconds_from_hours(form["interactive_max_h"], "interactive_max_s", errors),
            "idle_reclaim": form["idle_action"] == "reclaim",
            "max_priority_member": form["max_priority_member"], "max_priority_admin": form["max_priority_admin"],
            "allow_over_quota": form["allow_over_quota"], "allow_remote": form["allow_remote"],
            "connect_admins": form["connect_admins"],
        }
        if form["booking_no_show_min"]:  # left blank: it stays as it is
            changes["booking_no_show_min"] = form["booking_no_show_min"]
        if changes["interactive_max_s"] is None and "interactive_max_s" not in errors:
            errors["interactive_max_s"] = ["give a default duration in hours"]
        try:
            changes["idle_threshold"] = finite(form["idle_threshold_pct"]) / 100
        except ValueError:
            errors["idle_threshold"] = ["a percentage, e.g. 5"]
        for field, key, example in (("idle_after_s", "idle_after_min", 30), ("idle_warning_s", "idle_warning_min", 15),
                                    ("reclaim_grace_s", "reclaim_grace_min", 5)):
            if field == "reclaim_grace_s" and not form[key]:
                continue  # left blank: it stays as it is
            try:
                changes[field] = whole_seconds(form[key], 60)
            except ValueError:
                errors[field] = [f"a number of minutes, e.g. {example}"]
        if "reclaim_grace_s" in changes and not 0 <= changes["reclaim_grace_s"] <= 86400:
            errors["reclaim_grace_s"] = ["between 0 (reclaimed at once) and 1440 minutes (a day)"]
        if not errors:
            try:
                policy.set_policy(team, audit.web(request.user), changes)
            except RuleViolation as exc:
                errors = page_errors(exc.errors)
            else:
                messages.success(request, f"Policy of team {team.slug} saved: it applies to new requests and to "
                                 "the next idle check.")
                return redirect("team-policy", slug=team.slug)
        status = 400
    return page(request, team, "policy", "team/policy.html", {"form": form, "errors": errors,
                                                               "limits": current.limits, "policy": current}, status)
