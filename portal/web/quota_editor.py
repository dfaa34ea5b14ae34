"""Site admins edit a unit's quota rows (a team's or a department's) in the browser: one row per
GPU model or `*`, each with its guaranteed share, memory (GiB) and GPUs, borrowing and lending limits
(blank: unlimited) and weight. Saved as a whole through portal.tenancy.quotas.replace_quotas, which
refuses, with the numbers, rows that are malformed or children that would not fit their parent;
the refusals are shown on the fields they are about, in words.

Adding and removing a row re-draws the form without saving (plain form posts: no script needed).
Site admins only (everyone else: 403), like the quota API."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.fleet.model_names import fleet_model_names
from portal.tenancy import quotas
from portal.tenancy.models import ANY_MODEL, Department, Team

from . import quota_lines
from .fleet_admin import require_site_admin

AMOUNTS = ("gpu_share", "gpu_memory_gib", "gpus")
LIMITS = {"borrowing_limit": "borrow_", "lending_limit": "lend_"}
FIELDS = ("gpu_model", *AMOUNTS, *(p + r for p in LIMITS.values() for r in AMOUNTS), "weight")
MAX_ROWS = quotas.MAX_ROWS

# Names inside the services' messages → the words on the page.
WORDS = (
    (re.compile(r"\bgpu_memory_gib\b"), "GPU memory (GiB)"), (re.compile(r"\bgpu_share\b"), "GPU share"),
    (re.compile(r"\bgpus\b"), "GPUs"), (re.compile(r"\bgpu_model\b"), "GPU model"),
    (re.compile(r"\bborrowing_limit\b"), "borrowing limit"), (re.compile(r"\blending_limit\b"), "lending limit"),
    (re.compile(r"'s \* "), "'s any-model (*) "),
)
_ROW = re.compile(r"\bquotas\[(\d+)\]")
_KEY = re.compile(r"^quotas\[(\d+)\](?:\.(\w+))?$")
# A children-exceed-parent problem (portal.tenancy.quota_tree): "<dept>'s <bucket> <resource> is …".
_TREE = re.compile(r"^(?P<department>[a-z0-9-]+)'s (?P<bucket>.+?) (?P<resource>gpu_share|gpu_memory_gib|gpus) is ")


def in_words(message: str) -> str:
    message = _ROW.sub(lambda m: f"row {int(m.group(1)) + 1}", message)
    for pattern, words in WORDS:
        message = pattern.sub(words, message)
    return message


def _text(value) -> str:
    if value is None:
        return ""
    return quota_lines.quota_number(value) if not isinstance(value, int) else str(value)


def form_rows(unit_rows: list[quota_lines.QuotaRow]) -> list[dict]:
    """The unit's rows as the form's text values."""
    out = []
    for r in unit_rows:
        values = {"gpu_model": r.gpu_model, "gpu_share": _text(r.gpu_share), "gpu_memory_gib": _text(r.gpu_memory_gib),
                  "gpus": str(r.gpus), "weight": _text(r.weight)}
        for prefix, limit in (("borrow_", r.borrow), ("lend_", r.lend)):
            values |= {prefix + res: _text(v) for res, v in zip(AMOUNTS, limit, strict=True)}
        out.append(values)
    return out


def posted_rows(post) -> list[dict]:
    """The rows as posted (`rows` of them, fields `r<i>-<field>`), stripped."""
    try:
        count = min(max(int(post.get("rows", "0")), 0), MAX_ROWS + 1)
    except ValueError:
        count = 0
    return [{f: post.get(f"r{i}-{f}", "").strip() for f in FIELDS} for i in range(count)]


def service_rows(rows: list[dict]) -> list[dict]:
    """The form's rows as replace_quotas takes them: a blank amount is missing (the service says so),
    a blank limit unlimited, a blank weight 1."""
    out = []
    for r in rows:
        row = {"gpu_model": r["gpu_model"], **{res: r[res] or None for res in AMOUNTS}, "weight": r["weight"] or None}
        for name, prefix in LIMITS.items():
            values = {res: r[prefix + res] or None for res in AMOUNTS}
            row[name] = values if any(v is not None for v in values.values()) else None
        out.append(row)
    return out


def place_errors(refused: RuleViolation, rows: list[dict], unit_slug: str, is_department: bool
                 ) -> tuple[list[str], list[dict[str, list[str]]]]:
    """(messages for the whole form, per row: field → messages), in words. A message about a limit
    goes on the limit's field for the resource it names; a children-exceed-parent problem on the
    field of the row it is about (this unit's row of that bucket), and in the summary too."""
    summary: list[str] = []
    per_row: list[dict[str, list[str]]] = [{} for _ in rows]
    for key, problems in refused.errors.items():
        m = _KEY.match(key)
        for problem in problems:
            if m is None:
                summary.append(in_words(problem))
                found = _TREE.match(problem)
                if found:
                    _place_tree_problem(found, problem, rows, per_row, unit_slug, is_department)
                continue
            i, field = int(m.group(1)), m.group(2) or "row"
            if i >= len(rows):
                summary.append(in_words(problem))
                continue
            if field in LIMITS:
                resource = next((r for r in AMOUNTS if problem.startswith(r + " ")), None)
                if resource is not None:
                    field, problem = LIMITS[field] + resource, problem[len(resource) + 1:]
                else:
                    field = LIMITS[field] + AMOUNTS[0]
            if field not in FIELDS:
                field = "row"
            per_row[i].setdefault(field, []).append(in_words(problem))
    return summary, per_row


_NEED = re.compile(r"is (?P<limit>[\d.]+); its (?:children (?P<parts>.+?) = (?P<total>[\d.]+) exceed|"
                   r"child (?P<one>.+? (?P<single>[\d.]+)) exceeds) it")


def _place_tree_problem(found, problem: str, rows, per_row, unit_slug: str, is_department: bool) -> None:
    """On the field: the short form (what the units need, or what this one does not fit in); the
    whole sentence is in the summary above the form."""
    bucket, resource = found["bucket"], found["resource"]
    ours = is_department and found["department"] == unit_slug
    need = _NEED.search(problem)
    short = in_words(problem)
    if need:
        parts, total = (need["parts"], need["total"]) if need["parts"] else (need["one"], need["single"])
        short = (f"its units need {total} here ({parts})" if ours else
                 f"does not fit in {found['department']}'s {in_words(found['resource'])} of {need['limit']} for "
                 f"{'any model (*)' if bucket == ANY_MODEL else bucket}: {parts} = {total}")
    for i, r in enumerate(rows):
        if r["gpu_model"] == bucket or (not ours and bucket == ANY_MODEL and r["gpu_model"] == ANY_MODEL):
            per_row[i].setdefault(resource, []).append(short)
            return


def _models(rows: list[dict]) -> list[str]:
    known = fleet_model_names()
    return [ANY_MODEL, *known, *sorted({r["gpu_model"] for r in rows} - set(known) - {ANY_MODEL, ""})]


def _blank_row(rows: list[dict], models: list[str]) -> dict:
    taken = {r["gpu_model"] for r in rows}
    model = next((m for m in models if m not in taken), "")
    return {f: "" for f in FIELDS} | {"gpu_model": model, "gpu_share": "0", "gpu_memory_gib": "0", "gpus": "0",
                                      "weight": "1"}


def _unit_context(team: Team | None, department: Department | None) -> dict:
    """Where the unit sits: its parent's rows (what it must fit in) and its children's (what must fit in it)."""
    parent = team.department if team is not None else department.parent
    by_unit = quota_lines.rows_by_unit()
    children = []
    if department is not None:
        for d in department.children.order_by("slug"):
            children.append({"kind": "department", "slug": d.slug, "name": d.name,
                             "rows": by_unit.get(quota_lines.unit_of(department=d), [])})
        for t in department.teams.order_by("slug"):
            children.append({"kind": "team", "slug": t.slug, "name": t.name,
                             "rows": by_unit.get(quota_lines.unit_of(team=t), [])})
    unit = quota_lines.unit_of(team=team, department=department)
    return {"parent": parent, "parent_rows": by_unit.get(quota_lines.unit_of(department=parent), [])
            if parent is not None else [], "children": children,
            "lines": quota_lines.standings().get(unit, [])}


def editor(request, *, team: Team | None = None, department: Department | None = None):
    require_site_admin(request, "change quotas")
    unit = team or department
    kind = "team" if team is not None else "department"
    rows = form_rows(quota_lines.rows_of(team=team, department=department))
    summary: list[str] = []
    row_errors: list[dict] = [{} for _ in rows]
    unsaved, status = False, 200
    if request.method == "POST":
        rows = posted_rows(request.POST)
        action = request.POST.get("action", "save")
        models = _models(rows)
        if action == "add" and len(rows) < MAX_ROWS:
            rows.append(_blank_row(rows, models))
            unsaved = True
        elif action.startswith("remove-") and action[7:].isdigit() and int(action[7:]) < len(rows):
            del rows[int(action[7:])]
            unsaved = True
        else:
            try:
                quotas.replace_quotas(unit, audit.web(request.user), service_rows(rows))
            except RuleViolation as exc:
                summary, row_errors = place_errors(exc, rows, unit.slug, kind == "department")
                status = 400
            else:
                messages.success(request, f"Quotas of {kind} {unit.slug} saved: the next placement cycle uses them.")
                return redirect(f"fleet-{kind}-quotas", slug=unit.slug)
        if len(row_errors) != len(rows):
            row_errors = [{} for _ in rows]
    models = _models(rows)
    context = {
        "unit": unit, "kind": kind, "team": team, "department": department, "unsaved": unsaved,
        "summary": summary, "models": models, "max_rows": MAX_ROWS,
        "rows": [{"i": i, "v": r, "e": e, "label": quota_lines.bucket_label(r["gpu_model"], len(rows) == 1)
                  if r["gpu_model"] else "new row"} for i, (r, e) in enumerate(zip(rows, row_errors, strict=True))],
        **_unit_context(team, department),
    }
    return render(request, "fleet/quotas.html", context, status=status)


@login_required
def team_quotas_page(request, slug: str):
    require_site_admin(request, "change quotas")
    return editor(request, team=get_object_or_404(Team.objects.select_related("department"), slug=slug))


@login_required
def department_quotas_page(request, slug: str):
    require_site_admin(request, "change quotas")
    return editor(request, department=get_object_or_404(Department.objects.select_related("parent"), slug=slug))
