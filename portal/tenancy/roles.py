"""Who may see and do what, by team role. One place so pages, API and sockets agree."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import Membership, Role, Team

SUBMIT_ROLES = {Role.MEMBER, Role.ADMIN}


def is_site_admin(user) -> bool:
    """Site admins are Django's staff users: they see every team and set the fleet, the
    organisation and the teams' limits. The one answer pages, API and sockets ask for."""
    return user.is_authenticated and user.is_staff


def team_roles(user) -> dict[int, str]:
    """team id → role for an authenticated user (cached on the user object per request)."""
    if not user.is_authenticated:
        return {}
    cached = getattr(user, "_tessera_team_roles", None)
    if cached is None:
        # No ordering: Membership's default one (team slug, username) would join two tables to
        # sort what every caller reads as a mapping.
        cached = dict(Membership.objects.filter(user=user).order_by().values_list("team_id", "role"))
        user._tessera_team_roles = cached
    return cached


def remember_roles(user, roles: dict[int, str]) -> None:
    """Roles read together with the user (the API token lookup, in its one query), so that
    team_roles answers this request without a query of its own."""
    user._tessera_team_roles = roles


def visible_team_ids(user) -> list[int] | None:
    """The ids of the teams `user` may see; None for staff, who see every team. A list, so that
    a filter on it is `team_id IN (…)`, not a subquery on the teams."""
    return None if is_site_admin(user) else list(team_roles(user))


def visible_teams(user) -> QuerySet[Team]:
    ids = visible_team_ids(user)
    return Team.objects.all() if ids is None else Team.objects.filter(id__in=ids)


def role_in(user, team: Team | int) -> str | None:
    team_id = team if isinstance(team, int) else team.pk
    return team_roles(user).get(team_id)


def can_submit(user, team: Team) -> bool:
    return is_site_admin(user) or role_in(user, team) in SUBMIT_ROLES


def can_admin(user, team: Team | int) -> bool:
    return is_site_admin(user) or role_in(user, team) == Role.ADMIN


def forget_roles(user) -> None:
    user.__dict__.pop("_tessera_team_roles", None)
