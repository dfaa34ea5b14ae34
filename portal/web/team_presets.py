"""A team's presets (/team/<slug>/presets/): the request shapes its members are offered first."""

from __future__ import annotations

import shlex

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.audit import services as audit
from portal.connect.kinds import AppKind
from portal.errors import RuleViolation
from portal.fleet.model_names import fleet_models
from portal.reservations import presets
from portal.tenancy import policy
from portal.tenancy.models import Preset

from .numbers import hours_text, seconds_from_hours
from .team_admin import page, team_of
from .units import page_errors

PRESET_FIELDS = ("name", "kind", "gpu_model", "gpu_request", "gpu_limit", "gpu_memory_mib", "max_duration_h",
                 "image", "command", "app", "app_port")


def _preset_form(preset: Preset | None) -> dict:
    if preset is None:
        return {"name": "", "kind": "interactive", "gpu_model": "", "gpu_request": "0.25", "gpu_limit": "",
                "gpu_memory_mib": "8192", "max_duration_h": "", "image": "jupyter/base-notebook:latest",
                "command": "", "app": "", "app_port": ""}
    data = presets.as_dict(preset)
    data["command"] = shlex.join(preset.command)
    data["max_duration_h"] = hours_text(preset.max_duration_s)
    data["app_port"] = preset.app_port or ""
    return data


@login_required
def presets_page(request, slug: str):
    team = team_of(request, slug)
    editing = None
    if request.GET.get("edit"):
        editing = get_object_or_404(Preset, pk=request.GET["edit"] if request.GET["edit"].isdigit() else 0,
                                    team=team)
    form = _preset_form(editing)
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        if request.POST.get("id"):
            editing = get_object_or_404(Preset, pk=request.POST["id"] if request.POST["id"].isdigit() else 0,
                                        team=team)
        form = {k: request.POST.get(k, "").strip() for k in PRESET_FIELDS}
        data = {k: v for k, v in form.items() if k != "max_duration_h"}
        data["gpu_limit"] = data["gpu_limit"] or None
        data["max_duration_s"] = seconds_from_hours(form["max_duration_h"], "max_duration_s", errors)
        try:
            if errors:
                raise RuleViolation(errors)
            if editing is None:
                preset = presets.create_preset(team, audit.web(request.user), data)
            else:
                preset = presets.update_preset(editing, audit.web(request.user), data)
        except RuleViolation as exc:
            errors, status = page_errors(exc.errors), 400
        else:
            messages.success(request, f"Preset '{preset.name}' saved: team {team.slug}'s members see it first on "
                             "the request page.")
            return redirect("team-presets", slug=team.slug)
    return page(request, team, "presets", "team/presets.html", {
        "presets": presets.presets_of(team), "form": form, "errors": errors, "editing": editing,
        "models": sorted(fleet_models()), "longest": policy.policy_of(team).max_duration_s,
        "app_choices": AppKind.choices,
    }, status)


@login_required
@require_POST
def preset_delete(request, slug: str, pk: int):
    team = team_of(request, slug)
    preset = get_object_or_404(Preset, pk=pk, team=team)
    presets.delete_preset(preset, audit.web(request.user))
    messages.success(request, f"Preset '{preset.name}' deleted.")
    return redirect("team-presets", slug=team.slug)
