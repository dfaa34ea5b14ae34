"""Site admins arrange teams under departments: nested at most 4 levels below the organisation
(which has no row). The only writer of Department rows and of which department a team is in;
every change that moves quota in the tree is checked against the parents' quotas first
(portal.tenancy.quota_tree) and refused, with the numbers, if a parent would no longer hold its
children's quotas."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from portal.audit import services as audit
from portal.cycle_requests import request_cycle
from portal.errors import RuleViolation

from . import quota_tree, roles
from .models import Department, Team
from .teams import SLUG_RE


def visible_departments(user) -> QuerySet[Department]:
    """Every department for site admins; for others, those their teams are under (at any depth)."""
    if user.is_staff:
        return Department.objects.all()
    under = set(Team.objects.filter(id__in=roles.visible_team_ids(user), department__isnull=False)
                .values_list("department_id", flat=True))
    if not under:
        return Department.objects.none()
    parents = dict(Department.objects.order_by().values_list("pk", "parent_id"))
    seen: set[int] = set()
    for department in under:
        while department is not None and department not in seen:
            seen.add(department)
            department = parents.get(department)
    return Department.objects.filter(id__in=seen)


def _find(slug, field: str) -> Department | None:
    if slug is None or slug == "":
        return None
    found = Department.objects.filter(slug=str(slug)).first() if isinstance(slug, str) else None
    if found is None:
        raise RuleViolation({field: [f"no department '{slug}'; create it first, or leave this blank for none"]})
    return found


def _name(value, errors: dict) -> str:
    name = (value or "").strip() if isinstance(value, str) else ""
    if not name or len(name) > 120:
        errors["name"] = ["give the department a name of 1-120 characters"]
    return name


def _snapshot(department: Department) -> dict:
    return {"slug": department.slug, "name": department.name,
            "parent": department.parent.slug if department.parent_id else None}


def create_department(by: audit.Actor, slug: str, name: str, parent_slug: str | None = None) -> Department:
    errors: dict[str, list[str]] = {}
    slug = (slug or "").strip() if isinstance(slug, str) else ""
    if not SLUG_RE.match(slug):
        errors["slug"] = ["use 1-50 lowercase letters, digits and '-', starting and ending with a letter or digit"]
    elif Department.objects.filter(slug=slug).exists():
        errors["slug"] = [f"there is already a department '{slug}'; choose another short name"]
    name = _name(name, errors)
    try:
        parent = _find(parent_slug, "parent")
    except RuleViolation as refused:
        errors |= refused.errors
        parent = None
    if errors:
        raise RuleViolation(errors)
    try:
        with transaction.atomic():
            quota_tree.lock()
            if parent is not None:
                problem = quota_tree.depth_problem(quota_tree.QuotaTree.load(), slug, 1, parent.pk)
                if problem:
                    raise RuleViolation({"parent": [problem]})
            department = Department.objects.create(slug=slug, name=name, parent=parent)
            audit.record(by, object_type="department", object_id=department.pk, object_repr=slug,
                         action="created", after=_snapshot(department))
    except IntegrityError:
        raise RuleViolation({"slug": [f"there is already a department '{slug}'"]}) from None
    return department


def update_department(department: Department, by: audit.Actor, changes: dict) -> Department:
    """`changes`: "name" and/or "parent" (a department slug, or None for the organisation)."""
    errors: dict[str, list[str]] = {}
    for field in sorted(set(changes) - {"name", "parent"}, key=str):
        errors[str(field)] = ["not a department setting; change name or parent"]
    name = _name(changes["name"], errors) if "name" in changes else None
    if errors:
        raise RuleViolation(errors)
    with transaction.atomic():
        quota_tree.lock()
        department = Department.objects.select_related("parent").get(pk=department.pk)
        before = _snapshot(department)
        moved = False
        if "parent" in changes:
            parent = _find(changes["parent"], "parent")
            if (parent.pk if parent else None) != department.parent_id:
                _check_move(department, parent)
                department.parent = parent
                moved = True
        if name is not None:
            department.name = name
        department.save()
        old, new = audit.changed(before, _snapshot(department))
        if new:
            audit.record(by, object_type="department", object_id=department.pk, object_repr=department.slug,
                         action="moved" if moved else "changed", before=old, after=new)
    if moved:
        _request_cycle(f"department {department.slug} moved")
    return department


def _check_move(department: Department, parent: Department | None) -> None:
    tree = quota_tree.QuotaTree.load()
    if parent is not None and parent.pk == department.pk:
        raise RuleViolation({"parent": [f"a department cannot be its own parent ({department.slug})"]})
    if parent is not None and department.pk in tree.ancestors(parent.pk):
        raise RuleViolation({"parent": [f"{parent.slug} is inside {department.slug} ({tree.path(parent.pk)}); "
                                        "a department cannot go under one of its own departments"]})
    problem = quota_tree.depth_problem(tree, department.slug, tree.height(department.pk),
                                       parent.pk if parent else None)
    if problem:
        raise RuleViolation({"parent": [problem]})
    key = ("department", department.pk)
    tree.place(key, department.slug, parent.pk if parent else None)
    problems = tree.problems_up(key)
    if problems:
        raise RuleViolation({"parent": [p.message for p in problems]})


def delete_department(department: Department, by: audit.Actor) -> None:
    """RuleViolation while teams or departments are under it; its quota rows go with it."""
    with transaction.atomic():
        quota_tree.lock()
        department = Department.objects.get(pk=department.pk)
        teams = list(department.teams.order_by("slug").values_list("slug", flat=True))
        children = list(department.children.order_by("slug").values_list("slug", flat=True))
        if teams or children:
            held = " and ".join(part for part in (
                f"team{'s' if len(teams) > 1 else ''} {', '.join(teams)}" if teams else "",
                f"department{'s' if len(children) > 1 else ''} {', '.join(children)}" if children else "") if part)
            them = "them" if len(teams) + len(children) > 1 else "it"
            raise RuleViolation({"department": [f"department {department.slug} still holds {held}; move {them} "
                                                "elsewhere first"]})
        snapshot = _snapshot(department)
        pk = department.pk
        department.delete()
        audit.record(by, object_type="department", object_id=pk, object_repr=snapshot["slug"], action="deleted",
                     before=snapshot)
    _request_cycle(f"department {snapshot['slug']} deleted")


def move_team(team: Team, by: audit.Actor, department_slug: str | None) -> Team:
    """The team goes under `department_slug` (None: directly under the organisation); refused if a
    department above it would no longer hold its children's quotas."""
    with transaction.atomic():
        quota_tree.lock()
        team = Team.objects.select_for_update(of=("self",)).select_related("department").get(pk=team.pk)
        department = _find(department_slug, "department")
        if (department.pk if department else None) == team.department_id:
            return team
        tree = quota_tree.QuotaTree.load()
        tree.place(("team", team.pk), team.slug, department.pk if department else None)
        problems = tree.problems_up(("team", team.pk))
        if problems:
            raise RuleViolation({"department": [p.message for p in problems]})
        before = team.department.slug if team.department_id else None
        team.department = department
        team.save(update_fields=["department"])
        audit.record(by, object_type="team", object_id=team.pk, object_repr=team.slug, team=team, action="moved",
                     before={"department": before}, after={"department": department.slug if department else None})
    _request_cycle(f"team {team.slug} moved")
    return team


def _request_cycle(reason: str) -> None:
    request_cycle(reason, freed=True)  # what waited for quota may fit the new tree
