"""The site admins' team pages (/fleet/teams/): create teams, put them in a department, name them
and set the limits on their policy (their quota rows: quota_editor.py)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.tenancy import departments, policy, teams
from portal.tenancy.models import Department, Team, TeamPolicy

from . import quota_lines
from .fleet_admin import require_site_admin
from .numbers import finite, whole_seconds
from .quota_editor import in_words
from .units import page_errors


def _team_rows():
    """Every team with its department, quota rows, where it stands per bucket and its limits (a
    handful of queries for all of them)."""
    lines = quota_lines.standings()
    rows = quota_lines.rows_by_unit()
    limits = {p.team_id: p for p in TeamPolicy.objects.all()}
    return [{"team": team, "rows": rows.get(team.slug, []), "lines": lines.get(team.slug, []),
             "limits": limits.get(team.pk)} for team in Team.objects.select_related("department").order_by("slug")]


def _department_choices():
    return list(Department.objects.order_by("slug").values_list("slug", "name"))


@login_required
def teams_page(request):
    require_site_admin(request)
    form = {"slug": "", "name": "", "department": ""}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form}
        try:
            # No quota of its own yet (a `*` row of 0): it fits under any department, and the
            # site admin gives it its rows next, on its quota page.
            team = teams.create_team(audit.web(request.user), form["slug"], form["name"], form["department"] or None,
                                     quota_gpu_share="0", quota_memory_mib="0", quota_max_gpus="0")
        except RuleViolation as exc:
            errors, status = {k: [in_words(m) for m in v] for k, v in exc.errors.items()}, 400
        else:
            where = f" under department {team.department.slug}" if team.department_id else ""
            messages.success(request, f"Team {team.slug} created{where}, with no quota yet: give it its quota rows "
                             "here, then its first admin on its Members page.")
            return redirect("fleet-team-quotas", slug=team.slug)
    return render(request, "fleet/teams.html", {"rows": _team_rows(), "form": form, "errors": errors,
                                               "departments": _department_choices()}, status=status)


LIMIT_FORM = ("limit_duration_h", "limit_priority", "limit_idle_after_min", "limit_idle_threshold_pct",
              "limit_idle_warning_min")


@login_required
def team_limits_page(request, slug: str):
    require_site_admin(request)
    team = get_object_or_404(Team.objects.select_related("department"), slug=slug)
    current = policy.policy_of(team)
    limits = current.limits
    form = {"name": team.name, "department": team.department.slug if team.department_id else "",
            "limit_duration_h": f"{limits.duration_s / 3600:g}", "limit_priority": str(limits.priority),
            "limit_idle_after_min": f"{limits.idle_after_s / 60:g}" if limits.idle_after_s else "",
            "limit_idle_threshold_pct": f"{float(limits.idle_threshold) * 100:g}",
            "limit_idle_warning_min": f"{limits.idle_warning_s / 60:g}" if limits.idle_warning_s else "",
            "limit_require_reclaim": limits.require_reclaim, "limit_allow_over_quota": limits.allow_over_quota}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form if not isinstance(form[k], bool)} | {
            "limit_require_reclaim": request.POST.get("limit_require_reclaim") == "on",
            "limit_allow_over_quota": request.POST.get("limit_allow_over_quota") == "on"}
        changes = {"limit_priority": form["limit_priority"], "limit_require_reclaim": form["limit_require_reclaim"],
                   "limit_allow_over_quota": form["limit_allow_over_quota"]}
        for key, field, unit in (("limit_duration_h", "limit_duration_s", 3600),
                                 ("limit_idle_after_min", "limit_idle_after_s", 60),
                                 ("limit_idle_warning_min", "limit_idle_warning_s", 60)):
            if not form[key]:
                changes[field] = None
                continue
            try:
                changes[field] = whole_seconds(form[key], unit)
            except ValueError:
                errors[field] = [f"a number ({'hours' if unit == 3600 else 'minutes'})"]
        try:
            changes["limit_idle_threshold"] = finite(form["limit_idle_threshold_pct"] or "0") / 100
        except ValueError:
            errors["limit_idle_threshold"] = ["a percentage, e.g. 5"]
        if changes.get("limit_duration_s") is None and "limit_duration_s" not in errors:
            errors["limit_duration_s"] = ["give the longest duration in hours"]
        if not errors:
            try:
                # Name, department and limits are one change for the admin: all or nothing.
                with transaction.atomic():
                    teams.set_quota(team, audit.web(request.user), {"name": form["name"]})
                    departments.move_team(team, audit.web(request.user), form["department"] or None)
                    policy.set_limits(team, audit.web(request.user), changes)
            except RuleViolation as exc:
                errors = page_errors({k: [in_words(m) for m in v] for k, v in exc.errors.items()})
            else:
                messages.success(request, f"Team {team.slug} saved.")
                return redirect("fleet-team", slug=team.slug)
        status = 400
    return render(request, "fleet/team.html", {
        "team": team, "form": form, "errors": errors, "policy": current, "departments": _department_choices(),
        "rows": quota_lines.rows_of(team=team), "lines": quota_lines.standings().get(team.slug, [])}, status=status)
