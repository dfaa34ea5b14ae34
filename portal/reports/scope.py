"""Whose numbers a user may see in reports: site admins all teams, managers and team admins the
teams they manage; members none (a member's view of their own work is the reservations page).

Every report reads only the allocations, shares and waiting requests of these teams, so no total,
breakdown or filter can carry another team's numbers.
"""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework.exceptions import PermissionDenied, ValidationError

from portal.tenancy import roles
from portal.tenancy.models import Role, Team

REPORT_ROLES = {Role.MANAGER, Role.ADMIN}


class NoReports(PermissionDenied):
    default_detail = "reports are for team managers, team admins and site admins"


def report_teams(user) -> QuerySet[Team]:
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(id__in=[t for t, role in roles.team_roles(user).items() if role in REPORT_ROLES])


def may_see_reports(user) -> bool:
    return user.is_authenticated and (user.is_staff or report_teams(user).exists())


def teams_for(user, slug: str = "") -> list[Team]:
    """The teams a report covers: all the user manages, or the one named (refused alike when it
    does not exist and when it is not theirs, so the answer says nothing about other teams)."""
    if not may_see_reports(user):
        raise NoReports()
    teams = report_teams(user)
    if slug:
        teams = teams.filter(slug=slug)
        if not teams.exists():
            raise ValidationError({"team": [f"no team '{slug}' whose reports you may see"]})
    return list(teams.order_by("slug"))
