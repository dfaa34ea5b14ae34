"""What a change to a team would do to its reservations, in the words the admin is told (and the
audit row keeps): a member's removal, a group's rename or deletion, and a preview of where a
request carrying a group can land now. Reads only; tenancy's writers are handed the sentence."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from portal.fleet.models import Gpu
from portal.tenancy import groups
from portal.tenancy.models import Membership, Team

from .models import Allocation, Reservation
from .states import ACTIVE, HOLDS_GPU, State

PREVIEW_LINES = 12  # per list: a fleet of thousands of GPUs is summarised by counts beyond this


def member_removal(m: Membership) -> str:
    """What removing `m` does: they lose the team; their active reservations run on to their end."""
    active = Reservation.objects.filter(team_id=m.team_id, owner_id=m.user_id, state__in=ACTIVE).count()
    text = f"{m.user.username} will no longer see team {m.team.slug} or request for it"
    if active:
        text += f"; their {active} active reservation{'s' if active != 1 else ''} keep running until they end"
    return text


def carrying(obj) -> tuple[int, int]:
    """(shares placed or running, requests waiting) of the team that carry this label."""
    field = "exclusion" if groups.kind_of(obj) == "exclusion" else "affinity"
    qs = Reservation.objects.filter(team_id=obj.team_id, **{field: obj.label})
    if field == "affinity":
        qs = Reservation.objects.filter(team_id=obj.team_id).filter(
            **{"affinity": obj.label}) | Reservation.objects.filter(team_id=obj.team_id, anti_affinity=obj.label)
    return qs.filter(state__in=HOLDS_GPU).count(), qs.filter(state=State.PENDING).count()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def group_rename(obj, new_label: str) -> str:
    """What renaming a group to `new_label` does. Said before the rename: it counts what carries the
    old name."""
    held, waiting = carrying(obj)
    text = f"new requests use '{new_label}'"
    if held or waiting:
        text += (f"; {_plural(held, 'placed share')} and {_plural(waiting, 'waiting request')} keep '{obj.label}' "
                 "(running shares are never moved), and new requests will not share a GPU with them")
    return text


def group_deletion(obj) -> str:
    """What deleting a group does: what carries it keeps it until it ends."""
    held, waiting = carrying(obj)
    text = f"new requests can no longer choose '{obj.label}'"
    if held or waiting:
        text += (f"; {_plural(held, 'placed share')} and {_plural(waiting, 'waiting request')} keep it "
                 "until they end (running shares are never moved)")
    return text


@dataclass(frozen=True)
class Preview:
    """What a group means on the fleet now, in sentences, plus counts for the rest."""

    label: str
    kind: str
    lines: list[str]
    can_land: int  # GPUs a request in this group could share (by the group rule alone)
    cannot_land: int
    more: int  # lines left out


def preview(team: Team, kind: str, label: str) -> Preview:
    """Where a request of `team` carrying `label` can and cannot land by this rule alone (not
    counting free capacity, models or quota). Other teams' labels are not named."""
    live = (Allocation.objects.filter(released_at__isnull=True)
            .values_list("gpu_id", "reservation__team_id", "reservation__exclusion", "reservation__affinity",
                         "reservation__anti_affinity"))
    held: dict[int, list[tuple]] = defaultdict(list)
    for gpu_id, team_id, exclusion, affinity, anti in live:
        held[gpu_id].append((team_id, exclusion, affinity, anti))
    names = {pk: (node, index) for pk, node, index in
             Gpu.objects.filter(pk__in=list(held)).values_list("pk", "node__name", "index")}
    total = Gpu.objects.filter(healthy=True, cordoned=False).count()

    def gpu(pk: int) -> str:
        node, index = names.get(pk, ("?", "?"))
        return f"GPU {index} on {node}"

    def shown(team_id: int, value: str) -> str:
        return f"`{value}`" if team_id == team.pk else "another team's group"

    lines: list[str] = []
    blocked = 0
    ok_with_shares = 0
    for pk in sorted(held, key=lambda p: names.get(p, ("", 0))):
        shares = held[pk]
        if kind == "exclusion":
            labels = {(t, e) for t, e, _a, _n in shares}
            mine = {(team.pk, label)}
            if labels == mine:
                ok_with_shares += 1
                lines.append(f"{gpu(pk)} holds exclusion group `{label}`: only requests in `{label}` can join it")
            else:
                blocked += 1
                other = sorted((lab for lab in labels if lab != (team.pk, label)), key=str)
                what = ", ".join(
                    "shares outside any exclusion group" if not e else f"exclusion group {shown(t, e)}"
                    for t, e in other[:2])
                lines.append(f"{gpu(pk)} holds {what}; a request in `{label}` cannot land there")
        else:
            if any(t == team.pk and a == label for t, _e, a, _n in shares):
                ok_with_shares += 1
                lines.append(f"{gpu(pk)} holds affinity `{label}`: requests with affinity `{label}` go there "
                             "(and to other GPUs holding it) only")
            if any(t == team.pk and n == label for t, _e, _a, n in shares):
                blocked += 1
                lines.append(f"{gpu(pk)} holds anti-affinity `{label}`: requests with anti-affinity `{label}` "
                             "avoid it")
    if kind == "exclusion":
        empty = total - len(held)
        lines.append(f"{_plural(empty, 'empty GPU')} can take a request in `{label}` (it then keeps others out)")
        can_land = empty + ok_with_shares
    else:
        can_land = total - blocked
    more = max(0, len(lines) - PREVIEW_LINES - 1)
    if more:
        lines = lines[:PREVIEW_LINES] + lines[-1:]
    return Preview(label=label, kind=kind, lines=lines, can_land=can_land, cannot_land=blocked, more=more)


def group_now(obj) -> str:
    """A group's effect on the fleet now, in one line for its row on the groups page: what carries
    it, and how many GPUs could take its requests by its rule alone (`preview` has the detail)."""
    kind = groups.kind_of(obj)
    held, waiting = carrying(obj)
    seen = preview(obj.team, kind, obj.label)
    text = f"{_plural(held, 'placed share')}, {_plural(waiting, 'waiting request')}; " \
           f"{_plural(seen.can_land, 'GPU')} can take its requests"
    if seen.cannot_land:
        text += f", {seen.cannot_land} cannot"
    return text
