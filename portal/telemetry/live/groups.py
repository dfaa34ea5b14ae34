"""Live groups: their names, and who may join which.

`gpu:<id>` (the GPU's own numbers: staff only, since a card's load includes other teams' work; the
same rule as the utilization reports), `team:<id>` (the shares of a team's reservations: its
members, in any role, and staff) and `reservation:<id>` (as its team). GPU messages carry no
share; team and reservation messages carry only that team's shares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from portal.fleet.models import Gpu
from portal.reservations.models import Reservation
from portal.tenancy import roles

GROUP_PATTERN = re.compile(r"^(gpu|team|reservation):([1-9][0-9]{0,17})$")


@dataclass(frozen=True)
class Group:
    kind: str
    id: int

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.id}"

    @property
    def channel_group(self) -> str:
        # Channels group names allow only ASCII letters, digits, hyphens, underscores and periods.
        return f"live.{self.kind}.{self.id}"


def parse_group(name: object) -> Group | None:
    if not isinstance(name, str):
        return None
    m = GROUP_PATTERN.match(name)
    return Group(m.group(1), int(m.group(2))) if m else None


def may_see(user, group: Group) -> bool:
    """Whether `user` may receive `group`'s messages (re-checked while subscribed)."""
    if not user.is_authenticated or not user.is_active:
        return False
    if group.kind == "gpu":
        return user.is_staff and Gpu.objects.filter(pk=group.id).exists()
    if user.is_staff:
        if group.kind == "team":
            return True
        return Reservation.objects.filter(pk=group.id).exists()
    teams = roles.team_roles(user)
    if group.kind == "team":
        return group.id in teams
    team_id = Reservation.objects.filter(pk=group.id).values_list("team_id", flat=True).first()
    return team_id is not None and team_id in teams
