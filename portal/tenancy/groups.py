"""Exclusion groups and affinity labels of a team: create, rename, delete.

Reservations carry group labels as text (portal.reservations.models), read by the placement
engine for every new placement. So a change applies to the next placements only: shares already
placed keep the label they were placed with and are never moved. What a rename or deletion does
to the team's reservations is worded by portal.reservations.team_effects, which also previews
what a group means on the fleet now; the caller hands that sentence to `update` and `delete`."""

from __future__ import annotations

import re

from django.db import IntegrityError, transaction

from portal.audit import services as audit
from portal.errors import RuleViolation

from .models import LABEL_RE, AffinityLabel, ExclusionGroup, Team

KINDS = {"exclusion": ExclusionGroup, "affinity": AffinityLabel}
NOUN = {"exclusion": "exclusion group", "affinity": "affinity label"}


def kind_of(obj) -> str:
    return "exclusion" if isinstance(obj, ExclusionGroup) else "affinity"


def clean_label(team: Team, kind: str, label: str, *, instance=None) -> str:
    label = (label or "").strip()
    if not re.match(LABEL_RE, label):
        raise RuleViolation({"label": ["use 1-63 letters, digits, '-', '_' or '.', starting and ending with a "
                                       "letter or digit (e.g. 'secure-data')"]})
    clash = KINDS[kind].objects.filter(team=team, label=label).exclude(pk=getattr(instance, "pk", None))
    if clash.exists():
        raise RuleViolation({"label": [f"team {team.slug} already has an {NOUN[kind]} '{label}'; choose another name"]})
    return label


def _clean_description(description: str) -> str:
    description = (description or "").strip()
    if len(description) > 200:
        raise RuleViolation({"description": ["at most 200 characters"]})
    return description


def create(team: Team, by: audit.Actor, kind: str, label: str, description: str = ""):
    if kind not in KINDS:
        raise RuleViolation({"kind": ["must be 'exclusion' or 'affinity'"]})
    label = clean_label(team, kind, label)
    description = _clean_description(description)
    try:
        with transaction.atomic():
            obj = KINDS[kind].objects.create(team=team, label=label, description=description)
            audit.record(by, object_type=kind, object_id=obj.pk, object_repr=f"{team.slug}:{label}", team=team,
                         action="created", after={"label": label, "description": description},
                         message="applies to the next placements")
    except IntegrityError:
        raise RuleViolation({"label": [f"team {team.slug} already has an {NOUN[kind]} '{label}'"]}) from None
    return obj


def update(obj, by: audit.Actor, *, label: str | None = None, description: str | None = None,
           rename_effect: str = ""):
    """Rename and/or describe. A rename leaves the shares placed under the old name where they
    are, still carrying it: new requests under the new name do not join them. `rename_effect`:
    what the rename does to the team's reservations (team_effects.group_rename), audited with it."""
    kind = kind_of(obj)
    new_label = clean_label(obj.team, kind, label, instance=obj) if label is not None else obj.label
    new_description = _clean_description(description) if description is not None else obj.description
    before = {"label": obj.label, "description": obj.description}
    after = {"label": new_label, "description": new_description}
    old, new = audit.changed(before, after)
    if not new:
        return obj
    message = rename_effect if "label" in new else ""
    try:
        with transaction.atomic():
            obj.label, obj.description = new_label, new_description
            obj.save(update_fields=["label", "description"])
            audit.record(by, object_type=kind, object_id=obj.pk, object_repr=f"{obj.team.slug}:{new_label}",
                         team=obj.team, action="renamed" if "label" in new else "changed", before=old, after=new,
                         message=message)
    except IntegrityError:
        raise RuleViolation({"label": [f"team {obj.team.slug} already has an {NOUN[kind]} '{new_label}'"]}) from None
    return obj


def delete(obj, by: audit.Actor, effect: str) -> str:
    """`effect`: what the deletion does to the team's reservations (team_effects.group_deletion),
    audited with it and returned."""
    kind = kind_of(obj)
    with transaction.atomic():
        audit.record(by, object_type=kind, object_id=obj.pk, object_repr=f"{obj.team.slug}:{obj.label}",
                     team=obj.team, action="deleted", before={"label": obj.label, "description": obj.description},
                     message=effect)
        obj.delete()
    return effect
