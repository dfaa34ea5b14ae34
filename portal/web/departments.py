"""Site admins arrange the organisation in the browser: the tree of departments (nested at most 4
levels) with the teams under them, where each unit stands per bucket (GPU model or `*`: quota, in
use, borrowed beyond its quota, lent to others) as a chart per bucket with the table of its numbers,
and the changes: create, rename, move and delete a department, move a team to another department.
Quota rows are edited on each unit's quota page (quota_editor.py).

Every change goes through portal.tenancy.departments, which refuses (per field, with the numbers)
a move after which a parent would no longer hold its children's quotas; the refusal is shown on
the form it answers, in words. Site admins only (everyone else: 403), like the API."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.tenancy import departments as services
from portal.tenancy.models import ANY_MODEL, MAX_DEPARTMENT_DEPTH, Department, Team

from . import navigation, quota_lines
from .fleet_admin import require_site_admin
from .quota_editor import in_words


@dataclass
class Node:
    kind: str  # "department" or "team"
    obj: Department | Team
    level: int  # a top-level department is 1; a team is one below its department (1 under the organisation)
    unit: str  # the engine's name
    lines: list[quota_lines.Line] = field(default_factory=list)
    rows: list[quota_lines.QuotaRow] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)
    below: set[str] = field(default_factory=set)  # slugs of the departments inside it (for the move choices)

    @property
    def slug(self) -> str:
        return self.obj.slug

    @property
    def name(self) -> str:
        return self.obj.name or self.obj.slug

    @property
    def form_id(self) -> str:
        return f"{self.kind}-{self.obj.slug}"


def org_tree() -> tuple[list[Node], list[Node]]:
    """(the top of the tree: departments under the organisation, then teams there; every node in
    that order, depth first). Four queries for the whole tree and its standings."""
    lines = quota_lines.standings()
    rows = quota_lines.rows_by_unit()
    departments = list(Department.objects.select_related("parent").order_by("slug"))
    teams = list(Team.objects.select_related("department").order_by("slug"))
    nodes = {d.pk: Node("department", d, 0, quota_lines.unit_of(department=d)) for d in departments}
    top: list[Node] = []
    for d in departments:
        (nodes[d.parent_id].children if d.parent_id in nodes else top).append(nodes[d.pk])
    team_nodes = []
    for t in teams:
        node = Node("team", t, 0, t.slug)
        team_nodes.append(node)
        (nodes[t.department_id].children if t.department_id in nodes else top).append(node)
    flat: list[Node] = []

    def walk(node: Node, level: int) -> set[str]:
        node.level = level
        node.lines = lines.get(node.unit, [])
        node.rows = rows.get(node.unit, [])
        node.children.sort(key=lambda n: (n.kind != "department", n.slug))
        flat.append(node)
        for child in node.children:
            if child.kind == "department":
                node.below |= {child.slug} | walk(child, level + 1)
            else:
                walk(child, level + 1)
        return node.below

    top.sort(key=lambda n: (n.kind != "department", n.slug))
    for node in top:
        walk(node, 1)
    return top, flat


def charts(flat: list[Node]) -> list[dict]:
    """Per bucket, the units that stand in it (tree order) with quota / in use / borrowed / lent GPU
    share: what departments.js draws as grouped bars, and the table beside it."""
    buckets = sorted({line.bucket for n in flat for line in n.lines}, key=lambda b: (b != ANY_MODEL, b))
    out = []
    for i, bucket in enumerate(buckets):
        units = [(n, line) for n in flat for line in n.lines if line.bucket == bucket]
        out.append({
            "id": f"bucket-{i}", "bucket": bucket, "label": quota_lines.bucket_label(bucket, len(buckets) == 1),
            "rows": units,
            "data": {"units": [n.name for n, _ in units],
                     "series": [{"key": key, "label": label, "values": [float(getattr(line, key).share)
                                                                        for _, line in units]}
                                for key, label in (("quota", "quota"), ("used", "in use"),
                                                   ("borrowed", "borrowed"), ("lent", "lent"))]},
        })
    return out


def _act(request, action: str, by: audit.Actor) -> str:
    """Do what the form asks; the message to show. RuleViolation propagates."""
    post = request.POST
    if action == "create":
        d = services.create_department(by, post.get("slug", ""), post.get("name", ""), post.get("parent") or None)
        return f"Department {d.slug} created{f' under {d.parent.slug}' if d.parent_id else ''}. Give it quota rows " \
               "on its quota page, or leave it without: it then counts as the sum of its units."
    if action in ("update", "delete"):
        department = Department.objects.filter(slug=post.get("department", "")).first()
        if department is None:
            raise Http404("no such department")
        if action == "delete":
            services.delete_department(department, by)
            return f"Department {department.slug} deleted, with its quota rows."
        before = department.parent.slug if department.parent_id else None
        d = services.update_department(department, by, {"name": post.get("name", ""),
                                                        "parent": post.get("parent") or None})
        now = d.parent.slug if d.parent_id else None
        moved = f"; it is now under {now or 'the organisation'}" if now != before else ""
        return f"Department {d.slug} saved{moved}."
    if action == "move-team":
        team = Team.objects.filter(slug=post.get("team", "")).first()
        if team is None:
            raise Http404("no such team")
        team = services.move_team(team, by, post.get("department") or None)
        where = f"department {team.department.slug}" if team.department_id else "the organisation (no department)"
        return f"Team {team.slug} is now under {where}: its quotas count against it from the next cycle."
    raise Http404("no such action")


@login_required
def departments_page(request):
    require_site_admin(request, "arrange departments")
    errors: dict[str, dict[str, list[str]]] = {}
    posted: dict[str, dict] = {}
    status = 200
    if request.method == "POST":
        action = request.POST.get("action", "")
        form_id = {"create": "new", "update": f"department-{request.POST.get('department', '')}",
                   "delete": f"department-{request.POST.get('department', '')}",
                   "move-team": f"team-{request.POST.get('team', '')}"}.get(action, "")
        try:
            text = _act(request, action, audit.web(request.user))
        except RuleViolation as exc:
            errors[form_id] = {k: [in_words(m) for m in v] for k, v in exc.errors.items()}
            posted[form_id] = {k: v.strip() for k, v in request.POST.items() if k != "csrfmiddlewaretoken"}
            status = 400
        else:
            messages.success(request, text)
            return redirect("fleet-departments")
    top, flat = org_tree()
    departments = [n for n in flat if n.kind == "department"]
    for node in flat:
        node.errors = errors.get(node.form_id, {})
        node.posted = posted.get(node.form_id, {})
        if node.kind == "department":
            # Not itself nor inside itself; the service refuses depth and quota problems with the numbers.
            node.parents = [d for d in departments if d.slug != node.slug and d.slug not in node.below]
    return render(request, "fleet/departments.html", {
        "top": top, "flat": flat, "departments": departments, "charts": charts(flat),
        "new_errors": errors.get("new", {}), "new": posted.get("new", {}), "max_depth": MAX_DEPARTMENT_DEPTH,
        "teams": [n for n in flat if n.kind == "team"],
    }, status=status)


navigation.register("Departments", "fleet-departments", allowed=navigation.site_admin, order=71)
