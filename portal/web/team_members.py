"""A team's members page (/team/<slug>/members/): add people, change their role and default
groups, remove them; each message states the effect."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.reservations import team_effects
from portal.tenancy import members
from portal.tenancy.models import AffinityLabel, ExclusionGroup, Membership, Role

from .team_admin import page, show_refusal, team_of
from .units import page_errors


@login_required
def members_page(request, slug: str):
    team = team_of(request, slug)
    rows = (Membership.objects.filter(team=team).select_related("user", "default_exclusion", "default_affinity")
            .order_by("user__username"))
    form = {"user": "", "role": Role.MEMBER}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {"user": request.POST.get("user", "").strip(), "role": request.POST.get("role", Role.MEMBER)}
        try:
            m = members.add_member(team, audit.web(request.user), form["user"], form["role"])
        except RuleViolation as exc:
            errors, status = page_errors(exc.errors), 400
        else:
            messages.success(request, f"Added {m.user.username} as {m.get_role_display().lower()}: "
                             f"{members.effect_of(m.role, m.user.username, team)}.")
            return redirect("team-members", slug=team.slug)
    return page(request, team, "members", "team/members.html", {
        "rows": [(m, team_effects.member_removal(m)) for m in rows], "form": form, "errors": errors,
        "roles": Role.choices, "effects": [(r, members.effect_of(r, "they", team)) for r, _ in Role.choices],
        "exclusion_groups": ExclusionGroup.objects.filter(team=team).order_by("label"),
        "affinity_labels": AffinityLabel.objects.filter(team=team).order_by("label"),
    }, status)


def _membership(request, slug: str, pk: int):
    team = team_of(request, slug)
    return team, get_object_or_404(Membership.objects.select_related("user", "team"), pk=pk, team=team)


@login_required
@require_POST
def member_role(request, slug: str, pk: int):
    team, m = _membership(request, slug, pk)
    try:
        m = members.change_role(m, audit.web(request.user), request.POST.get("role", ""))
    except RuleViolation as exc:
        show_refusal(request, exc)
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
    except RuleViolation as exc:
        show_refusal(request, exc)
    else:
        messages.success(request, f"Defaults of {m.user.username} saved: they apply to their next requests.")
    return redirect("team-members", slug=team.slug)


@login_required
@require_POST
def member_remove(request, slug: str, pk: int):
    team, m = _membership(request, slug, pk)
    try:
        effect = members.remove_member(m, audit.web(request.user), team_effects.member_removal(m))
    except RuleViolation as exc:
        show_refusal(request, exc)
    else:
        messages.success(request, f"Removed {m.user.username}: {effect}.")
    return redirect("team-members", slug=team.slug)
