"""Presets: request shapes a team's admins offer their members first on the request page.

A preset is checked by the same rules a request is (rules.py) and against the team's policy, so
choosing one always gives a request the portal accepts. (The table is tenancy's `Preset`: it
belongs to the team; this is its one writer.)"""

from __future__ import annotations

import shlex
from decimal import Decimal

from django.db import IntegrityError, transaction

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.fleet.model_names import display_model
from portal.tenancy.models import Preset, Team
from portal.tenancy.policy import policy_of

from . import rules

FIELDS = ("name", "kind", "gpu_model", "gpu_request", "gpu_limit", "gpu_memory_mib", "max_duration_s", "image",
          "command", "app", "app_port")


def presets_of(team: Team) -> list[Preset]:
    return list(Preset.objects.filter(team=team).order_by("name"))


def as_dict(preset: Preset) -> dict:
    return {
        "id": preset.pk, "team": preset.team.slug, "name": preset.name, "kind": preset.kind,
        "gpu_model": preset.gpu_model, "gpu_request": str(preset.gpu_request), "gpu_limit": str(preset.gpu_limit),
        "gpu_memory_mib": preset.gpu_memory_mib, "max_duration_s": preset.max_duration_s, "image": preset.image,
        "command": list(preset.command), "app": preset.app, "app_port": preset.app_port,
    }


def _clean(team: Team, data: dict, *, instance: Preset | None) -> dict:
    errors: dict[str, list[str]] = {}
    unknown = set(data) - set(FIELDS)
    for name in sorted(unknown):
        errors[name] = ["not a preset field"]
    base = as_dict(instance) if instance else {"kind": "interactive", "gpu_model": "", "gpu_limit": None,
                                                  "max_duration_s": None, "command": [], "app": "",
                                                  "app_port": None}
    merged = {k: v for k, v in base.items() if k in FIELDS} | {k: v for k, v in data.items() if k in FIELDS}
    name = str(merged.get("name") or "").strip()
    if not name or len(name) > 80:
        errors.setdefault("name", []).append("give the preset a name of 1-80 characters")
    elif Preset.objects.filter(team=team, name=name).exclude(pk=getattr(instance, "pk", None)).exists():
        errors.setdefault("name", []).append(f"team {team.slug} already has a preset '{name}'; choose another name")
    for required in ("image", "gpu_request", "gpu_memory_mib"):
        if merged.get(required) in (None, ""):
            errors.setdefault(required, []).append("required")
    command = merged.get("command") or []
    if isinstance(command, str):  # typed on the page: split as a shell would, quotes kept together
        try:
            command = shlex.split(command)
        except ValueError as exc:
            errors.setdefault("command", []).append(
                f"the command could not be split like a shell would: {exc} (close every quote)")
            command = []
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        errors.setdefault("command", []).append("a list of arguments (strings)")
        command = []
    if merged.get("gpu_limit") in ("",):
        merged["gpu_limit"] = None
    for optional in ("max_duration_s", "app_port"):
        if merged.get(optional) in ("",):
            merged[optional] = None
    if errors:
        raise RuleViolation(errors)
    spec = rules.ReservationSpec(
        team=team, image=str(merged["image"]), gpu_request=merged["gpu_request"],
        gpu_memory_mib=merged["gpu_memory_mib"], gpu_limit=merged.get("gpu_limit"),
        # Either name of a model (the label-safe "NVIDIA-A100-SXM4-80GB" too), stored as the engine knows it.
        gpu_model=display_model(str(merged.get("gpu_model") or "")), kind=str(merged.get("kind") or ""),
        command=command,
        max_duration_s=merged.get("max_duration_s"), priority=0,
        app=str(merged.get("app") or ""), app_port=merged.get("app_port"),
    )
    rules.check(spec)
    longest = policy_of(team).max_duration_s
    if spec.max_duration_s is not None and spec.max_duration_s > longest:
        raise RuleViolation({"max_duration_s": [f"team {team.slug}'s policy allows at most {longest} s"]})
    return {"name": name, "kind": spec.kind, "gpu_model": spec.gpu_model, "gpu_request": spec.gpu_request,
            "gpu_limit": spec.gpu_limit, "gpu_memory_mib": spec.gpu_memory_mib, "max_duration_s": spec.max_duration_s,
            "image": spec.image, "command": command, "app": spec.app,
            # the port as given (blank: the app's default, also if that default changes)
            "app_port": int(merged["app_port"]) if spec.app and merged.get("app_port") is not None else None}


def _jsonable(values: dict) -> dict:
    return {k: str(v) if isinstance(v, Decimal) else v for k, v in values.items()}


def create_preset(team: Team, by: audit.Actor, data: dict) -> Preset:
    values = _clean(team, data, instance=None)
    try:
        with transaction.atomic():
            preset = Preset.objects.create(team=team, created_by=by.user_obj, **values)
            audit.record(by, object_type="preset", object_id=preset.pk, object_repr=f"{team.slug}/{preset.name}",
                         team=team, action="created", after=_jsonable(values))
    except IntegrityError:  # a concurrent create with the same name
        raise RuleViolation({"name": [f"team {team.slug} already has a preset '{values['name']}'"]}) from None
    return preset


def update_preset(preset: Preset, by: audit.Actor, data: dict) -> Preset:
    values = _clean(preset.team, data, instance=preset)
    before = _jsonable({k: getattr(preset, k) for k in values})
    try:
        with transaction.atomic():
            for name, value in values.items():
                setattr(preset, name, value)
            preset.save()
            old, new = audit.changed(before, _jsonable(values))
            if new:
                audit.record(by, object_type="preset", object_id=preset.pk,
                             object_repr=f"{preset.team.slug}/{preset.name}", team=preset.team, action="changed",
                             before=old, after=new)
    except IntegrityError:
        raise RuleViolation({"name": [f"team {preset.team.slug} already has a preset '{values['name']}'"]}) from None
    return preset


def delete_preset(preset: Preset, by: audit.Actor) -> None:
    with transaction.atomic():
        audit.record(by, object_type="preset", object_id=preset.pk, object_repr=f"{preset.team.slug}/{preset.name}",
                     team=preset.team, action="deleted", before=_jsonable(as_dict(preset)))
        preset.delete()
