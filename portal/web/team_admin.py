"""Team admins run their teams in the browser: members, exclusion groups and affinity labels
(with a preview of their effect on the fleet), presets, policy and the quota view.

Every view finds the team among those the user may see (another team is 404) and refuses those
who may not administer it (403), exactly as the API does; the services do the rest."""

from __future__ import annotations

import re
import shlex

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.audit import services as audit
from portal.connect.kinds import AppKind
from portal.reservations import rules
from portal.tenancy import groups, members, policy, presets, roles, usage
from portal.tenancy.errors import Refused
from portal.tenancy.models import LABEL_RE, AffinityLabel, ExclusionGroup, Membership, Preset, Role, TeamPolicy

from . import navigation, quota_lines
from .numbers import finite, whole_seconds
from .templatetags.tessera import share
from .units import page_errors

TABS = [("members", "Members"), ("groups", "Groups & labels"), ("presets", "Presets"), ("policy", "Policy"),
        ("quota", "Quota")]


def administered_teams(user):
    teams = roles.visible_teams(user)
    if not user.is_staff:
        teams = teams.filter(id__in=[t for t, r in roles.team_roles(user).items() if r == Role.ADMIN])
    return teams.order_by("slug")


def _team(request, slug: str):
    """The team, if the user may administer it: 404 for teams they cannot see, 403 otherwise."""
    team = roles.visible_teams(request.user).filter(slug=slug).first()
    if team is None:
        raise Http404("no such team")
    if not roles.can_admin(request.user, team):
        raise PermissionDenied(f"only team {team.slug}'s admins may do this")
    return team


def _page(request, team, tab: str, template: str, context: dict, status: int = 200):
    return render(request, template, {"team": team, "tab": tab, "tabs": TABS,
                                      "teams": administered_teams(request.user), **context}, status=status)


def _refused(request, exc: Refused) -> None:
    for field, problems in exc.errors.items():
        for problem in problems:
            messages.error(request, problem if field in ("__all__", "detail") else f"{field.replace('_', ' ')}: "
                           f"{problem}")


@login_required
def team_home(request):
    teams = administered_teams(request.user)
    wanted = request.GET.get("team", "")
    if wanted and not re.fullmatch(r"[-a-zA-Z0-9_]+", wanted):
        return HttpResponseBadRequest("team: give a team's short name (letters, digits, '-' and '_')")
    first = (teams.filter(slug=wanted).first() if wanted else None) or teams.first()
    if first is None:
        raise PermissionDenied("you administer no team")
    return redirect("team-members", slug=first.slug)


# Members -------------------------------------------------------------------------------------

@login_required
def members_page(request, slug: str):
    team = _team(request, slug)
    rows = (Membership.objects.filter(team=team).select_related("user", "default_exclusion", "default_affinity")
            .order_by("user__username"))
    form = {"user": "", "role": Role.MEMBER}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {"user": request.POST.get("user", "").strip(), "role": request.POST.get("role", Role.MEMBER)}
        try:
            m = members.add_member(team, audit.web(request.user), form["user"], form["role"])
        except Refused as exc:
            errors, status = page_errors(exc.errors), 400
        else:
            messages.success(request, f"Added {m.user.username} as {m.get_role_display().lower()}: "
                             f"{members.effect_of(m.role, m.user.username, team)}.")
            return redirect("team-members", slug=team.slug)
    return _page(request, team, "members", "team/members.html", {
        "rows": [(m, members.removal_effect(m)) for m in rows], "form": form, "errors": errors,
        "roles": Role.choices, "effects": [(r, members.effect_of(r, "they", team)) for r, _ in Role.choices],
        "exclusion_groups": ExclusionGroup.objects.filter(team=team).order_by("label"),
        "affinity_labels": AffinityLabel.objects.filter(team=team).order_by("label"),
    }, status)


def _membership(request, slug: str, pk: int):
    team = _team(request, slug)
    return team, get_object_or_404(Membership.objects.select_related("user", "team"), pk=pk, team=team)


@login_required
@require_POST
def member_role(request, slug: str, pk: int):
    team, m = _membership(request, slug, pk)
    try:
        m = members.change_role(m, audit.web(request.user), request.POST.get("role", ""))
    except Refused as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"{m.user.username} is now {m.get_role_display().lower()}: "
                         f"{members.effect_of(m.role, m.user.username, team)}.")
    return redirect("team-members", slug=team.slug)


@login_required
@require_POST
def member_defaults(request, slug: str, pk: int):
    team, m = _membership(request, slug, pk)
    try:
        members.set_defaults(m, audit.web(request.user), exclusion=request.POST.get("default_exclusion") or None,
                             affinity=request.POST.get("default_affinity") or None)
    except Refused as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"Defaults of {m.user.username} saved: they apply to their next requests.")
    return redirect("team-members", slug=team.slug)


@login_required
@require_POST
def member_remove(request, slug: str, pk: int):
    team, m = _membership(request, slug, pk)
    try:
        effect = members.remove_member(m, audit.web(request.user))
    except Refused as exc:
        _refused(request, exc)
    else:
        messages.success(request, f"Removed {m.user.username}: {effect}.")
    return redirect("team-members", slug=team.slug)


# Exclusion groups and affinity labels --------------------------------------------------------

def _group(team, kind: str, pk: int):
    model = groups.KINDS.get(kind)
    if model is None:
        raise Http404("no such kind")
    return get_object_or_404(model, pk=pk, team=team)


@login_required
def groups_page(request, slug: str):
    team = _team(request, slug)
    form = {"kind": request.POST.get("kind", "exclusion"), "label": "", "description": ""}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in ("kind", "label", "description")}
        try:
            obj = groups.create(team, audit.web(request.user), form["kind"], form["label"], form["description"])
        except Refused as exc:
            errors, status = page_errors(exc.errors), 400
        else:
            messages.success(request, f"Created {groups.NOUN[form['kind']]} '{obj.label}': it applies to the next "
                             "placements.")
            return redirect("team-groups", slug=team.slug)
    sections = [("exclusion", "Exclusion groups", list(ExclusionGroup.objects.filter(team=team).order_by("label"))),
                ("affinity", "Affinity labels", list(AffinityLabel.objects.filter(team=team).order_by("label")))]
    for _kind, _title, items in sections:
        for g in items:
            g.effect_now = groups.effect_now(g)
    return _page(request, team, "groups", "team/groups.html", {
        "sections": sections,
        "form": form, "errors": errors,
    }, status)


@login_required
@require_GET
def group_preview(request, slug: str):
    """The fragment under the groups: where a request carrying the label can land now."""
    team = _team(request, slug)
    kind = request.GET.get("kind", "exclusion")
    label = request.GET.get("label", "").strip()
    if kind not in groups.KINDS:
        raise Http404("no such kind")
    preview = None
    problem = ""
    if label:
        # Looked up only once it is a well-formed label (a NUL character would reach the database).
        existing = groups.KINDS[kind].objects.filter(team=team, label=label).first() \
            if re.match(LABEL_RE, label) else None
        try:
            groups.clean_label(team, kind, label, instance=existing)
        except Refused as exc:
            problem = exc.errors["label"][0]
        else:
            preview = groups.preview(team, kind, label)
    return render(request, "team/_preview.html", {"preview": preview, "problem": problem, "kind": kind,
                                                  "noun": groups.NOUN[kind]})


@login_required
@require_POST
def group_rename(request, slug: str, kind: str, pk: int):
    team = _team(request, slug)
    obj = _group(team, kind, pk)
    old = obj.label
    try:
        groups.update(obj, audit.web(request.user), label=request.POST.get("label", ""),
                      description=request.POST.get("description", obj.description))
    except Refused as exc:
        _refused(request, exc)
    else:
        if obj.label != old:
            messages.success(request, f"Renamed '{old}' to '{obj.label}': {groups.rename_effect(obj, obj.label)}.")
        else:
            messages.success(request, f"Saved '{obj.label}'.")
    return redirect("team-groups", slug=team.slug)


@login_required
@require_POST
def group_delete(request, slug: str, kind: str, pk: int):
    team = _team(request, slug)
    obj = _group(team, kind, pk)
    effect = groups.delete(obj, audit.web(request.user))
    messages.success(request, f"Deleted '{obj.label}': {effect}.")
    return redirect("team-groups", slug=team.slug)


# Presets -------------------------------------------------------------------------------------

PRESET_FIELDS = ("name", "kind", "gpu_model", "gpu_request", "gpu_limit", "gpu_memory_mib", "max_duration_h",
                 "image", "command", "app", "app_port")


def _preset_form(preset: Preset | None) -> dict:
    if preset is None:
        return {"name": "", "kind": "interactive", "gpu_model": "", "gpu_request": "0.25", "gpu_limit": "",
                "gpu_memory_mib": "8192", "max_duration_h": "", "image": "jupyter/base-notebook:latest",
                "command": "", "app": "", "app_port": ""}
    data = presets.as_dict(preset)
    data["command"] = shlex.join(preset.command)
    data["max_duration_h"] = _hours(preset.max_duration_s)
    data["app_port"] = preset.app_port or ""
    return data


@login_required
def presets_page(request, slug: str):
    team = _team(request, slug)
    editing = None
    if request.GET.get("edit"):
        editing = get_object_or_404(Preset, pk=request.GET["edit"] if request.GET["edit"].isdigit() else 0,
                                    team=team)
    form = _preset_form(editing)
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        if request.POST.get("id"):
            editing = get_object_or_404(Preset, pk=request.POST["id"] if request.POST["id"].isdigit() else 0,
                                        team=team)
        form = {k: request.POST.get(k, "").strip() for k in PRESET_FIELDS}
        data = {k: v for k, v in form.items() if k != "max_duration_h"}
        data["gpu_limit"] = data["gpu_limit"] or None
        data["max_duration_s"] = _seconds_from_hours(form["max_duration_h"], "max_duration_s", errors)
        try:
            if errors:
                raise Refused(errors)
            if editing is None:
                preset = presets.create_preset(team, audit.web(request.user), data)
            else:
                preset = presets.update_preset(editing, audit.web(request.user), data)
        except Refused as exc:
            errors, status = page_errors(exc.errors), 400
        else:
            messages.success(request, f"Preset '{preset.name}' saved: team {team.slug}'s members see it first on "
                             "the request page.")
            return redirect("team-presets", slug=team.slug)
    return _page(request, team, "presets", "team/presets.html", {
        "presets": presets.presets_of(team), "form": form, "errors": errors, "editing": editing,
        "models": sorted(rules.fleet_models()), "longest": policy.policy_of(team).max_duration_s,
        "app_choices": AppKind.choices,
    }, status)


@login_required
@require_POST
def preset_delete(request, slug: str, pk: int):
    team = _team(request, slug)
    preset = get_object_or_404(Preset, pk=pk, team=team)
    presets.delete_preset(preset, audit.web(request.user))
    messages.success(request, f"Preset '{preset.name}' deleted.")
    return redirect("team-presets", slug=team.slug)


# Policy --------------------------------------------------------------------------------------

POLICY_FIELDS = ("max_duration_s", "interactive_max_s", "idle_threshold", "idle_after_s", "idle_reclaim",
                 "idle_warning_s", "max_priority_member", "max_priority_admin", "allow_over_quota")


def _hours(seconds) -> str:
    if seconds in (None, ""):
        return ""
    return f"{int(seconds) / 3600:g}"


def _seconds_from_hours(value: str, field: str, errors: dict):
    value = (value or "").strip()
    if not value:
        return None
    try:
        return whole_seconds(value, 3600)
    except ValueError:
        errors.setdefault(field, []).append(f"a number of hours, e.g. 8 or 0.5 (got {value!r})")
        return None


@login_required
def policy_page(request, slug: str):
    team = _team(request, slug)
    current = policy.policy_of(team)
    row = TeamPolicy.objects.filter(team=team).first()
    row_max = row.max_duration_s if row else None  # blank: the site limit applies
    form = {
        "max_duration_h": _hours(row_max), "interactive_max_h": _hours(current.interactive_max_s),
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
            "max_duration_s": _seconds_from_hours(form["max_duration_h"], "max_duration_s", errors),
            "interactive_max_s": _seconds_from_hours(form["interactive_max_h"], "interactive_max_s", errors),
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
            except Refused as exc:
                errors = page_errors(exc.errors)
            else:
                messages.success(request, f"Policy of team {team.slug} saved: it applies to new requests and to "
                                 "the next idle check.")
                return redirect("team-policy", slug=team.slug)
        status = 400
    return _page(request, team, "policy", "team/policy.html", {"form": form, "errors": errors,
                                                               "limits": current.limits, "policy": current}, status)


# Quota ---------------------------------------------------------------------------------------

@login_required
def quota_page(request, slug: str):
    """The team's line per bucket (quota, in use, borrowed beyond it, lent to others) and who
    borrows now from the group it lends to; per member; what waits and why."""
    team = _team(request, slug)
    lines = quota_lines.standings()
    current = policy.policy_of(team)
    use = usage.team_usage(team)
    mine = lines.get(team.slug, [])
    beyond = "allowed: priority-0 requests, preemptible" if use.allow_over_quota else "not allowed by the policy"
    return _page(request, team, "quota", "team/quota.html", {
        "usage": use, "lines": mine, "only_any": len(mine) == 1, "beyond": beyond,
        "opportunistic": f"{share(use.opportunistic_in_use)} GPU",
        "borrowers": quota_lines.borrowers_from(team.slug, lines), "grace": current.reclaim_grace_s,
        "department": team.department})


navigation.register("Team", "team-admin", allowed=navigation.team_admin, order=60, section="/team/")
