"""Site admins create teams and set their quotas (the limits on their policy are in
portal.tenancy.policy.set_limits). A quota below what the team already holds is refused: running
shares are never ended to make a quota fit."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from django.db import IntegrityError, transaction

from portal.audit import services as audit

from .errors import Refused
from .models import Team

SLUG_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,48}[a-z0-9])?$")
QUOTA_FIELDS = ("quota_gpu_share", "quota_memory_mib", "quota_max_gpus")


def _quota_values(changes: dict, errors: dict) -> dict:
    out = {}
    for name, value in changes.items():
        if name == "quota_gpu_share":
            try:
                number = Decimal(str(value)).quantize(Decimal("0.001"))
            except (InvalidOperation, ValueError):
                errors[name] = [f"must be a decimal number of GPUs, got {value!r}"]
                continue
            if not Decimal(0) <= number <= 100000:
                errors[name] = ["must be between 0 and 100000 GPUs"]
                continue
        else:
            try:
                number = int(str(value))
            except (TypeError, ValueError):
                errors[name] = [f"must be a whole number, got {value!r}"]
                continue
            if not 0 <= number <= 10**12:
                errors[name] = ["must not be negative"]
                continue
        out[name] = number
    return out


def _snapshot(team: Team) -> dict:
    return {"slug": team.slug, "name": team.name, "quota_gpu_share": str(team.quota_gpu_share),
            "quota_memory_mib": team.quota_memory_mib, "quota_max_gpus": team.quota_max_gpus}


def create_team(by: audit.Actor, slug: str, name: str, **quota) -> Team:
    errors: dict[str, list[str]] = {}
    slug = (slug or "").strip()
    name = (name or "").strip()
    if not SLUG_RE.match(slug):
        errors["slug"] = ["use 1-50 lowercase letters, digits and '-', starting and ending with a letter or digit"]
    elif Team.objects.filter(slug=slug).exists():
        errors["slug"] = [f"there is already a team '{slug}'; choose another short name"]
    if not name or len(name) > 120:
        errors["name"] = ["give the team a name of 1-120 characters"]
    unknown = set(quota) - set(QUOTA_FIELDS)
    for field in sorted(unknown):
        errors[field] = ["not a quota"]
    values = _quota_values({k: v for k, v in quota.items() if k in QUOTA_FIELDS}, errors)
    if errors:
        raise Refused(errors)
    try:
        with transaction.atomic():
            team = Team.objects.create(slug=slug, name=name, **values)
            audit.record(by, object_type="team", object_id=team.pk, object_repr=slug, team=team, action="created",
                         after=_snapshot(team))
    except IntegrityError:
        raise Refused({"slug": [f"there is already a team '{slug}'"]}) from None
    return team


def set_quota(team: Team, by: audit.Actor, changes: dict) -> Team:
    """Quota fields (and the name); below what is in use is refused with the numbers."""
    from portal.reservations.quota import usage_of  # reservations depends on tenancy at import

    errors: dict[str, list[str]] = {}
    unknown = set(changes) - set(QUOTA_FIELDS) - {"name"}
    for field in sorted(unknown):
        errors[field] = ["not a quota setting"]
    name = changes.get("name")
    if name is not None and (not str(name).strip() or len(str(name)) > 120):
        errors["name"] = ["give the team a name of 1-120 characters"]
    values = _quota_values({k: v for k, v in changes.items() if k in QUOTA_FIELDS}, errors)
    if errors:
        raise Refused(errors)
    with transaction.atomic():
        # The submit path locks the team row too: no request is admitted between check and write.
        team = Team.objects.select_for_update().get(pk=team.pk)
        usage = usage_of(team)
        in_use = {"quota_gpu_share": (usage.gpu_share, "GPU share"), "quota_memory_mib": (usage.memory_mib, "MiB"),
                  "quota_max_gpus": (usage.gpus, "GPUs")}
        for field, number in values.items():
            used, unit = in_use[field]
            if number < used:
                errors[field] = [f"team {team.slug} holds {used} {unit} now; set at least that, or wait until its "
                                 "reservations end (running shares are never ended to fit a quota)"]
        if errors:
            raise Refused(errors)
        before = _snapshot(team)
        for field, number in values.items():
            setattr(team, field, number)
        if name is not None:
            team.name = str(name).strip()
        team.save(update_fields=[*values, *(["name"] if name is not None else [])])
        old, new = audit.changed(before, _snapshot(team))
        if new:
            audit.record(by, object_type="team", object_id=team.pk, object_repr=team.slug, team=team,
                         action="quota changed", before=old, after=new)
    from portal.reservations.events import request_cycle

    if values:
        request_cycle(f"quota of team {team.slug} changed")
    return team
