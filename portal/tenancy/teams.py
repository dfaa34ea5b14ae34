"""Site admins create teams and change their name and flat quota (the limits on their policy are in
portal.tenancy.policy.set_limits, the department a team is in in portal.tenancy.departments).

The flat quota (quota_gpu_share, quota_memory_mib, quota_max_gpus) is deprecated: it is the team's
`*` Quota row (any GPU model without a row of its own), read through Team's properties of those
names and written here through portal.tenancy.quotas; quotas per model are quotas.replace_quotas.
A quota below what the team holds now is allowed: work beyond a quota is borrowed, and reclaimable;
running shares are never ended to make a quota fit."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from django.db import IntegrityError, transaction

from portal.audit import services as audit
from portal.errors import RuleViolation

from . import quota_tree, quotas
from .models import Department, Team, mib_to_gib

SLUG_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,48}[a-z0-9])?$")
QUOTA_FIELDS = ("quota_gpu_share", "quota_memory_mib", "quota_max_gpus")
# What the deprecated fields are in the `*` row, and what a team got when they were not given.
RESOURCE_OF = {"quota_gpu_share": "gpu_share", "quota_memory_mib": "gpu_memory_gib", "quota_max_gpus": "gpus"}
DEFAULT_QUOTA = {"quota_gpu_share": Decimal("1.000"), "quota_memory_mib": 80 * 1024, "quota_max_gpus": 4}
BOUNDS = {"quota_memory_mib": (10**12, "MiB"), "quota_max_gpus": (10**6, "GPUs")}


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
            high, unit = BOUNDS[name]
            if not 0 <= number <= high:
                errors[name] = [f"must be between 0 and {high} {unit}"]
                continue
        out[name] = number
    return out


def _amounts(values: dict) -> dict:
    """Deprecated field values as the `*` row's resources (MiB → GiB: quotas.models.mib_to_gib)."""
    return {RESOURCE_OF[f]: mib_to_gib(v) if f == "quota_memory_mib" else v for f, v in values.items()}


def _snapshot(team: Team) -> dict:
    return {"slug": team.slug, "name": team.name, "department": team.department.slug if team.department_id else None,
            "quota_gpu_share": str(team.quota_gpu_share), "quota_memory_mib": team.quota_memory_mib,
            "quota_max_gpus": team.quota_max_gpus}


def create_team(by: audit.Actor, slug: str, name: str, department: Department | str | None = None, **quota) -> Team:
    """A team under `department` (a Department or its slug; None: directly under the organisation)
    with its `*` quota row from the deprecated fields (1.0 GPU of share, 80 GiB, 4 GPUs where not
    given). RuleViolation if the department's quotas would not hold it (on the quota fields given, else on
    `department`)."""
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
    given = _quota_values({k: v for k, v in quota.items() if k in QUOTA_FIELDS}, errors)
    if isinstance(department, str) and department:
        found = Department.objects.filter(slug=department).first()
        if found is None:
            errors["department"] = [f"no department '{department}'; create it first, or leave this blank for none"]
        department = found
    elif not isinstance(department, Department):
        department = None
    if errors:
        raise RuleViolation(errors)
    try:
        with transaction.atomic():
            quota_tree.lock()
            team = Team.objects.create(slug=slug, name=name, department=department)
            fields = {RESOURCE_OF[f]: f if f in given or department is None else "department" for f in QUOTA_FIELDS}
            quotas.set_any_model_quota(team, by, _amounts(DEFAULT_QUOTA | given), fields)
            audit.record(by, object_type="team", object_id=team.pk, object_repr=slug, team=team, action="created",
                         after=_snapshot(team))
    except IntegrityError:
        raise RuleViolation({"slug": [f"there is already a team '{slug}'"]}) from None
    return team


def set_quota(team: Team, by: audit.Actor, changes: dict) -> Team:
    """The deprecated quota fields (the team's `*` row) and the name. RuleViolation, on the field, if a
    department above the team would no longer hold its children's quotas."""
    errors: dict[str, list[str]] = {}
    unknown = set(changes) - set(QUOTA_FIELDS) - {"name"}
    for field in sorted(unknown):
        errors[field] = ["not a quota setting"]
    name = changes.get("name")
    if name is not None and (not str(name).strip() or len(str(name)) > 120):
        errors["name"] = ["give the team a name of 1-120 characters"]
    values = _quota_values({k: v for k, v in changes.items() if k in QUOTA_FIELDS}, errors)
    if errors:
        raise RuleViolation(errors)
    with transaction.atomic():
        quota_tree.lock()
        team = Team.objects.select_for_update().get(pk=team.pk)
        if name is not None and str(name).strip() != team.name:
            before = team.name
            team.name = str(name).strip()
            team.save(update_fields=["name"])
            audit.record(by, object_type="team", object_id=team.pk, object_repr=team.slug, team=team,
                         action="renamed", before={"name": before}, after={"name": team.name})
        if values:
            quotas.set_any_model_quota(team, by, _amounts(values), {RESOURCE_OF[f]: f for f in QUOTA_FIELDS})
    return Team.objects.get(pk=team.pk)
