"""Role checks for objects the user can already see (invisible ones are 404 by queryset)."""

from __future__ import annotations

from rest_framework.exceptions import PermissionDenied

from portal.reservations.models import Reservation
from portal.tenancy import roles
from portal.tenancy.models import Role, Team


def require_submit(user, team: Team) -> None:
    if not roles.can_submit(user, team):
        raise PermissionDenied(f"your role in team {team.slug} is read-only")


def require_team_admin(user, team: Team) -> None:
    if not roles.can_admin(user, team):
        raise PermissionDenied(f"only team {team.slug}'s admins may do this")


def require_staff(user) -> None:
    if not roles.is_site_admin(user):
        raise PermissionDenied("only site admins may do this")


def require_cancel(user, reservation: Reservation) -> None:
    """Owners cancel their own; team admins any of their team's; managers never; staff always."""
    if user.is_staff or roles.can_admin(user, reservation.team_id):
        return
    role = roles.role_in(user, reservation.team_id)
    if reservation.owner_id == user.pk and role in (Role.MEMBER, Role.ADMIN):
        return
    raise PermissionDenied("only the owner or a team admin may cancel this reservation")
