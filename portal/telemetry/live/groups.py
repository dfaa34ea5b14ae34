"""Live groups: their names, and who may join which.

`gpu:<id>` (the GPU's own numbers: staff only, since a card's load includes other teams' work; the
same rule as the utilization reports), `fleet` (which nodes changed in the fleet view: a node's
state, a GPU cordoned, shares placed or released; staff only, like the page), `team:<id>` (the
shares of a team's reservations: its members, in any role, and staff) and `reservation:<id>` (as
its team), `user:<id>` (that person's unread notifications: only they may join). GPU messages
carry no share; team and reservation messages carry only that team's shares; fleet messages carry
node ids only (the page fetches the rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from portal.fleet.models import Gpu
from portal.reservations.models import Reservation
from portal.tenancy import roles

GROUP_PATTERN = re.compile(r"^(?:(gpu|team|reservation|user):([1-9][0-9]{0,17})|(fleet))$")
FLEET = "fleet"


@dataclass(frozen=True)
class Group:
    kind: str
    id: int

    @property
    def name(self) -> str:
        return self.kind if self.kind == FLEET else f"{self.kind}:{self.id}"

    @property
    def channel_group(self) -> str:
        # Channels group names allow only ASCII letters, digits, hyphens, underscores and periods.
        return "live.fleet" if self.kind == FLEET else f"live.{self.kind}.{self.id}"


def parse_group(name: object) -> Group | None:
    if not isinstance(name, str):
        return None
    m = GROUP_PATTERN.match(name)
    if m is None:
        return None
    return Group(FLEET, 0) if m.group(3) else Group(m.group(1), int(m.group(2)))


def may_see(user, group: Group) -> bool:
    """Whether `user` may receive `group`'s messages (re-checked while subscribed)."""
    if not user.is_authenticated or not user.is_active:
        return False
    if group.kind == "user":
        return group.id == user.pk  # one's own unread count, nobody else's
    if group.kind == FLEET:
        return user.is_staff  # the whole fleet, every team's shares: site admins only
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
