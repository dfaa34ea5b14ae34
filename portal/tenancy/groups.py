"""Exclusion groups and affinity labels of a team: create, rename, delete, and a preview of what
a group means on the fleet right now.

Reservations carry group labels as text (portal.reservations.models), read by the placement
engine for every new placement. So a change applies to the next placements only: shares already
placed keep the label they were placed with and are never moved; the preview says so."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from portal.audit import services as audit

from .errors import Refused
from .models import LABEL_RE, AffinityLabel, ExclusionGroup, Team

KINDS = {"exclusion": ExclusionGroup, "affinity": AffinityLabel}
NOUN = {"exclusion": "exclusion group", "affinity": "affinity label"}
PREVIEW_LINES = 12  # per list: a fleet of thousands of GPUs is summarised by counts beyond this


def kind_of(obj) -> str:
    return "exclusion" if isinstance(obj, ExclusionGroup) else "affinity"


def clean_label(team: Team, kind: str, label: str, *, instance=None) -> str:
    import re

    label = (label or "").strip()
    if not re.match(LABEL_RE, label):
        raise Refused({"label": ["use 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or "
                                 "digit (e.g. 'secure-data')"]})
    clash = KINDS[kind].objects.filter(team=team, label=label).exclude(pk=getattr(instance, "pk", None))
    if clash.exists():
        raise Refused({"label": [f"team {team.slug} already has an {NOUN[kind]} '{label}'; choose another name"]})
    return label


def _clean_description(description: str) -> str:
    description = (description or "").strip()
    if len(description) > 200:
        raise Refused({"description": ["at most 200 characters"]})
    return description


def create(team: Team, by: audit.Actor, kind: str, label: str, description: str = ""):
    if kind not in KINDS:
        raise Refused({"kind": ["must be 'exclusion' or 'affinity'"]})
    label = clean_label(team, kind, label)
    description = _clean_description(description)
    try:
        with transaction.atomic():
            obj = KINDS[kind].objects.create(team=team, label=label, description=description)
            audit.record(by, object_type=kind, object_id=obj.pk, object_repr=f"{team.slug}:{label}", team=team,
                         action="created", after={"label": label, "description": description},
                         message="applies to the next placements")
    except IntegrityError:
        raise Refused({"label": [f"team {team.slug} already has an {NOUN[kind]} '{label}'"]}) from None
    return obj


def update(obj, by: audit.Actor, *, label: str | None = None, description: str | None = None):
    """Rename and/or describe. A rename leaves the shares placed under the old name where they
    are, still carrying it: new requests under the new name do not join them."""
    kind = kind_of(obj)
    new_label = clean_label(obj.team, kind, label, instance=obj) if label is not None else obj.label
    new_description = _clean_description(description) if description is not None else obj.description
    before = {"label": obj.label, "description": obj.description}
    after = {"label": new_label, "description": new_description}
    old, new = audit.changed(before, after)
    if not new:
        return obj
    message = ""
    if "label" in new:
        message = rename_effect(obj, new_label)
    try:
        with transaction.atomic():
            obj.label, obj.description = new_label, new_description
            obj.save(update_fields=["label", "description"])
            audit.record(by, object_type=kind, object_id=obj.pk, object_repr=f"{obj.team.slug}:{new_label}",
                         team=obj.team, action="renamed" if "label" in new else "changed", before=old, after=new,
                         message=message)
    except IntegrityError:
        raise Refused({"label": [f"team {obj.team.slug} already has an {NOUN[kind]} '{new_label}'"]}) from None
    return obj


def delete(obj, by: audit.Actor) -> str:
    kind = kind_of(obj)
    effect = delete_effect(obj)
    with transaction.atomic():
        audit.record(by, object_type=kind, object_id=obj.pk, object_repr=f"{obj.team.slug}:{obj.label}",
                     team=obj.team, action="deleted", before={"label": obj.label, "description": obj.description},
                     message=effect)
        obj.delete()
    return effect


def _carrying(obj) -> tuple[int, int]:
    """(shares placed or running, requests waiting) of the team that carry this label."""
    from portal.reservations.models import Reservation
    from portal.reservations.states import HOLDS_GPU, State

    field = "exclusion" if kind_of(obj) == "exclusion" else "affinity"
    qs = Reservation.objects.filter(team_id=obj.team_id, **{field: obj.label})
    if field == "affinity":
        qs = Reservation.objects.filter(team_id=obj.team_id).filter(
            **{"affinity": obj.label}) | Reservation.objects.filter(team_id=obj.team_id, anti_affinity=obj.label)
    return qs.filter(state__in=HOLDS_GPU).count(), qs.filter(state=State.PENDING).count()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def rename_effect(obj, new_label: str) -> str:
    held, waiting = _carrying(obj)
    text = f"new requests use '{new_label}'"
    if held or waiting:
        text += (f"; {_plural(held, 'placed share')} and {_plural(waiting, 'waiting request')} keep '{obj.label}' "
                 "(running shares are never moved), and new requests will not share a GPU with them")
    return text


def delete_effect(obj) -> str:
    held, waiting = _carrying(obj)
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
    from portal.fleet.models import Gpu
    from portal.reservations.models import Allocation

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


def effect_now(obj) -> str:
    """A group's effect on the fleet now, in one line for its row on the groups page: what carries
    it, and how many GPUs could take its requests by its rule alone (`preview` has the detail)."""
    kind = kind_of(obj)
    held, waiting = _carrying(obj)
    seen = preview(obj.team, kind, obj.label)
    text = f"{_plural(held, 'placed share')}, {_plural(waiting, 'waiting request')}; " \
           f"{_plural(seen.can_land, 'GPU')} can take its requests"
    if seen.cannot_land:
        text += f", {seen.cannot_land} cannot"
    return text
