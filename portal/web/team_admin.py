"""The frame of the team admins' pages (/team/): the tabs, the team a page is for, and the landing
page. Each tab is its own module: team_members.py, team_groups.py (exclusion groups and affinity
labels, with a preview of their effect on the fleet), team_presets.py, team_policy.py,
team_quota.py.

Every view finds the team among those the user may see (another team is 404) and refuses those
who may not administer it (403), exactly as the API does; the services do the rest."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render

from portal.errors import RuleViolation
from portal.tenancy import roles
from portal.tenancy.models import Role

from . import navigation

TABS = [("members", "Members"), ("groups", "Groups & labels"), ("presets", "Presets"), ("policy", "Policy"),
        ("quota", "Quota")]


def administered_teams(user):
    teams = roles.visible_teams(user)
    if not user.is_staff:
        teams = teams.filter(id__in=[t for t, r in roles.team_roles(user).items() if r == Role.ADMIN])
    return teams.order_by("slug")


def team_of(request, slug: str):
    """The team, if the user may administer it: 404 for teams they cannot see, 403 otherwise."""
    team = roles.visible_teams(request.user).filter(slug=slug).first()
    if team is None:
        raise Http404("no such team")
    if not roles.can_admin(request.user, team):
        raise PermissionDenied(f"only team {team.slug}'s admins may do this")
    return team


def page(request, team, tab: str, template: str, context: dict, status: int = 200):
    return render(request, template, {"team": team, "tab": tab, "tabs": TABS,
                                      "teams": administered_teams(request.user), **context}, status=status)


def show_refusal(request, exc: RuleViolation) -> None:
    """A refused action (a POST that redirects back) as messages on the page it returns to."""
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


navigation.register("Team", "team-admin", allowed=navigation.team_admin, order=60, section="/team/")
