"""A team's exclusion groups and affinity labels (/team/<slug>/groups/): create, rename, delete,
each row with its effect now, and the preview fragment of where a label's requests can land."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.reservations import team_effects
from portal.tenancy import groups
from portal.tenancy.models import LABEL_RE, AffinityLabel, ExclusionGroup

from .team_admin import page, show_refusal, team_of
from .units import page_errors


def _group(team, kind: str, pk: int):
    model = groups.KINDS.get(kind)
    if model is None:
        raise Http404("no such kind")
    return get_object_or_404(model, pk=pk, team=team)


@login_required
def groups_page(request, slug: str):
    team = team_of(request, slug)
    form = {"kind": request.POST.get("kind", "exclusion"), "label": "", "description": ""}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in ("kind", "label", "description")}
        try:
            obj = groups.create(team, audit.web(request.user), form["kind"], form["label"], form["description"])
        except RuleViolation as exc:
            errors, status = page_errors(exc.errors), 400
        else:
            messages.success(request, f"Created {groups.NOUN[form['kind']]} '{obj.label}': it applies to the next "
                             "placements.")
            return redirect("team-groups", slug=team.slug)
    sections = [("exclusion", "Exclusion groups", list(ExclusionGroup.objects.filter(team=team).order_by("label"))),
                ("affinity", "Affinity labels", list(AffinityLabel.objects.filter(team=team).order_by("label")))]
    for _kind, _title, items in sections:
        for g in items:
            g.effect_now = team_effects.group_now(g)
    return page(request, team, "groups", "team/groups.html", {
        "sections": sections,
        "form": form, "errors": errors,
    }, status)


@login_required
@require_GET
def group_preview(request, slug: str):
    """The fragment under the groups: where a request carrying the label can land now."""
    team = team_of(request, slug)
    kind = request.GET.get("kind", "exclusion")
    label = request.GET.get("label", "").strip()
    if kind not in groups.KINDS:
        raise Http404("no such kind")
    preview = None
    problem = ""
    if label:
        # Looked up only once it is a well-formed label (a NUL character would reach the database).
        existing = groups.KINDS[kind].objects.filter(team=team, label=label).first() \
            if re.match(LABEL_RE, label) else None
        try:
            groups.clean_label(team, kind, label, instance=existing)
        except RuleViolation as exc:
            problem = exc.errors["label"][0]
        else:
            preview = team_effects.preview(team, kind, label)
    return render(request, "team/_preview.html", {"preview": preview, "problem": problem, "kind": kind,
                                                  "noun": groups.NOUN[kind]})


@login_required
@require_POST
def group_rename(request, slug: str, kind: str, pk: int):
    team = team_of(request, slug)
    obj = _group(team, kind, pk)
    old = obj.label
    label = request.POST.get("label", "")
    effect = team_effects.group_rename(obj, label.strip())  # before the rename: what carries the old label
    try:
        groups.update(obj, audit.web(request.user), label=label,
                      description=request.POST.get("description", obj.description), rename_effect=effect)
    except RuleViolation as exc:
        show_refusal(request, exc)
    else:
        if obj.label != old:
            messages.success(request, f"Renamed '{old}' to '{obj.label}': {effect}.")
        else:
            messages.success(request, f"Saved '{obj.label}'.")
    return redirect("team-groups", slug=team.slug)


@login_required
@require_POST
def group_delete(request, slug: str, kind: str, pk: int):
    team = team_of(request, slug)
    obj = _group(team, kind, pk)
    effect = groups.delete(obj, audit.web(request.user), team_effects.group_deletion(obj))
    messages.success(request, f"Deleted '{obj.label}': {effect}.")
    return redirect("team-groups", slug=team.slug)
