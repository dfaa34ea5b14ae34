"""The organisation's tree in memory (departments, teams, their quota rows) and the rule its writers
check before they commit: children's quotas fit their parent's.

The rule, per department D and per bucket B that D has a row for, per resource: the sum over D's
children (teams and departments) of their quotas that resolve to B at D must not exceed D's row.
A child's quota for model M resolves at D to M if D has a row for M, else to `*`. What a child
department claims from D (`claims`) is its own rows, plus, where it has no `*` row, what its own
children claim that none of its rows covers, by model: a department without a row for a bucket
counts as the sum of its children there, model by model, so a team's A100 quota under a
department without rows counts against the grandparent's A100 row, not its `*` one.

Only portal.tenancy.quotas and portal.tenancy.departments use this, inside a transaction holding
`lock()`, so two changes never pass the check against each other's old rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from .models import ANY_MODEL, MAX_DEPARTMENT_DEPTH, Department, Quota, Team

RESOURCES = ("gpu_share", "gpu_memory_gib", "gpus")
ZERO = Decimal("0.000")


@dataclass(frozen=True)
class Amount:
    gpu_share: Decimal = ZERO
    gpu_memory_gib: Decimal = ZERO
    gpus: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.gpu_share + other.gpu_share, self.gpu_memory_gib + other.gpu_memory_gib,
                      self.gpus + other.gpus)


def show(resource: str, value) -> str:
    return str(value) if resource == "gpus" else f"{Decimal(value).quantize(Decimal('0.001'))}"


@dataclass(frozen=True)
class Problem:
    """One bucket of one department that its children's quotas exceed, in one resource."""

    department: str
    bucket: str
    resource: str
    message: str


Key = tuple[str, int]  # ("team", id) or ("department", id)


@dataclass
class Unit:
    slug: str
    parent: int | None  # a department id; None: directly under the organisation
    rows: dict[str, Amount] = field(default_factory=dict)


def lock() -> None:
    """Holds every department row until the transaction ends: every change of the tree or of a
    quota takes it first (then the team row, where there is one), so checks and writes are serial."""
    list(Department.objects.select_for_update().order_by("pk").values_list("pk", flat=True))


class QuotaTree:
    def __init__(self, units: dict[Key, Unit]):
        self.units = units
        self._claims: dict[Key, dict[str, Amount]] = {}

    @classmethod
    def load(cls) -> QuotaTree:
        units: dict[Key, Unit] = {}
        for pk, slug, parent in Department.objects.order_by().values_list("pk", "slug", "parent_id"):
            units[("department", pk)] = Unit(slug, parent)
        for pk, slug, parent in Team.objects.order_by().values_list("pk", "slug", "department_id"):
            units[("team", pk)] = Unit(slug, parent)
        for q in Quota.objects.order_by().values("team_id", "department_id", "gpu_model", *RESOURCES):
            key = ("team", q["team_id"]) if q["team_id"] is not None else ("department", q["department_id"])
            units[key].rows[q["gpu_model"]] = Amount(q["gpu_share"], q["gpu_memory_gib"], q["gpus"])
        return cls(units)

    # Changes, before they are written, to check the tree as it would be.
    def place(self, key: Key, slug: str, parent: int | None) -> None:
        self.units.setdefault(key, Unit(slug, parent)).parent = parent
        self._claims.clear()

    def set_rows(self, key: Key, rows: dict[str, Amount]) -> None:
        self.units[key].rows = dict(rows)
        self._claims.clear()

    # Shape.
    def children(self, department: int) -> list[Key]:
        return sorted((k for k, u in self.units.items() if u.parent == department), key=lambda k: self.units[k].slug)

    def ancestors(self, department: int | None) -> list[int]:
        """`department` and the departments above it, nearest first."""
        out: list[int] = []
        while department is not None and department not in out:
            out.append(department)
            department = self.units[("department", department)].parent
        return out

    def level(self, department: int) -> int:
        return len(self.ancestors(department))

    def height(self, department: int) -> int:
        """Levels from `department` down to its deepest sub-department, itself counted."""
        below = [k[1] for k in self.children(department) if k[0] == "department"]
        return 1 + max((self.height(d) for d in below), default=0)

    def path(self, department: int) -> str:
        return " → ".join(self.units[("department", d)].slug for d in reversed(self.ancestors(department)))

    # The rule.
    def claims(self, key: Key) -> dict[str, Amount]:
        """What `key` asks of its parent, by model (or `*`)."""
        if key in self._claims:
            return self._claims[key]
        unit = self.units[key]
        out = dict(unit.rows)
        if key[0] == "department" and ANY_MODEL not in unit.rows:
            for child in self.children(key[1]):
                for model, amount in self.claims(child).items():
                    if model not in unit.rows:
                        out[model] = out.get(model, Amount()) + amount
        self._claims[key] = out
        return out

    def problems(self, department: int) -> list[Problem]:
        unit = self.units[("department", department)]
        if not unit.rows:
            return []
        per_bucket: dict[str, list[tuple[str, Amount]]] = {}
        for child in self.children(department):
            sums: dict[str, Amount] = {}
            for model, amount in self.claims(child).items():
                bucket = model if model in unit.rows else ANY_MODEL
                if bucket in unit.rows:
                    sums[bucket] = sums.get(bucket, Amount()) + amount
            for bucket, amount in sums.items():
                per_bucket.setdefault(bucket, []).append((self.units[child].slug, amount))
        out = []
        for bucket in sorted(per_bucket, key=lambda b: (b != ANY_MODEL, b)):
            limit = unit.rows[bucket]
            for resource in RESOURCES:
                parts = [(slug, getattr(a, resource)) for slug, a in per_bucket[bucket] if getattr(a, resource)]
                total = sum((v for _, v in parts), 0)
                if total > getattr(limit, resource):
                    out.append(Problem(unit.slug, bucket, resource, _message(unit.slug, bucket, resource,
                                                                             getattr(limit, resource), parts, total)))
        return out

    def problems_up(self, key: Key) -> list[Problem]:
        """The rule at `key` (a department) and at every department above it."""
        start = key[1] if key[0] == "department" else self.units[key].parent
        return [p for d in self.ancestors(start) for p in self.problems(d)]


def _message(department: str, bucket: str, resource: str, limit, parts: Iterable[tuple[str, object]],
             total) -> str:
    parts = list(parts)
    named = " + ".join(f"{slug} {show(resource, v)}" for slug, v in parts)
    if len(parts) == 1:
        return (f"{department}'s {bucket} {resource} is {show(resource, limit)}; its child {named} exceeds it: "
                f"raise {department}'s quota or lower the child's")
    return (f"{department}'s {bucket} {resource} is {show(resource, limit)}; its children {named} = "
            f"{show(resource, total)} exceed it: raise {department}'s quota or lower the children's")


def depth_problem(tree: QuotaTree, department_slug: str, height: int, parent: int | None) -> str | None:
    """Why a department `height` levels deep (itself counted) cannot go under `parent`, or None."""
    base = tree.level(parent) if parent is not None else 0
    deepest = base + height
    if deepest <= MAX_DEPARTMENT_DEPTH:
        return None
    under = f"under {tree.units[('department', parent)].slug} (level {base})" if parent is not None else "there"
    if height == 1:
        return (f"{under}, {department_slug} would be at level {deepest}; departments nest at most "
                f"{MAX_DEPARTMENT_DEPTH} levels deep")
    return (f"{under}, {department_slug} would be at level {base + 1} and its deepest department at level "
            f"{deepest}; departments nest at most {MAX_DEPARTMENT_DEPTH} levels deep")
