"""Where each unit (department or team) stands per bucket, in people's units, for the pages: the
departments page, the fleet's team pages, the team admins' quota page and the home page.

One reader: `portal.reservations.engine_quotas.standings()` (the engine's own accounting of quota,
counted use, borrowed beyond quota and lent to others, per unit and bucket), and the quota rows
themselves (`portal.tenancy.models.Quota`) for the limits and weights the editor shows.
Read-only; the callers check who may see what."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from portal.reservations import engine_quotas
from portal.tenancy.models import ANY_MODEL, Department, Quota, Team
from scheduler.core.fairshare import MILLI

DEPARTMENT = engine_quotas.DEPARTMENT  # how the engine names a department: "department:<slug>"
RESOURCES = ("gpu_share", "gpu_memory_gib", "gpus")


def bucket_label(bucket: str, alone: bool = False) -> str:
    """`*` in words: "any model" where it is a unit's only row, else "any other model"."""
    if bucket != ANY_MODEL:
        return bucket
    return "any model (*)" if alone else "any other model (*)"


def unit_of(team: Team | None = None, department: Department | None = None) -> str:
    return team.slug if team is not None else f"{DEPARTMENT}{department.slug}"


@dataclass(frozen=True)
class Amount:
    """Compute share (whole GPUs count 1), GPU memory (MiB) and GPUs held, as the pages show them."""

    share: Decimal
    memory_mib: int
    gpus: float

    @classmethod
    def of(cls, vec) -> Amount:
        milli, mib, gpus = vec
        return cls((Decimal(str(round(float(milli)))) / MILLI).quantize(Decimal("0.001")), round(float(mib)),
                   round(float(gpus), 2))

    @property
    def zero(self) -> bool:
        return not (self.share or self.memory_mib or self.gpus)

    @property
    def gpus_text(self) -> str:
        return f"{self.gpus:g}"


NOTHING = Amount(Decimal("0.000"), 0, 0)


@dataclass(frozen=True)
class Line:
    """One unit's standing in one bucket now (the engine's `Standing`, in people's units)."""

    unit: str
    bucket: str
    quota: Amount
    used: Amount
    borrowed: Amount
    lent: Amount
    has_row: bool = True  # False: a team holding work of a model it has no quota row for (quota 0)

    @property
    def model(self) -> str:
        return self.bucket

    @property
    def over(self) -> bool:
        return not self.borrowed.zero

    @property
    def meter_max(self) -> Decimal:
        """A meter of in-use against quota: over the quota it runs past `high` (drawn as a warning)."""
        return max(self.quota.share, self.used.share) or Decimal(1)


def standings() -> dict[str, list[Line]]:
    """Engine unit name → its lines, `*` first then by model."""
    rows = {(q.team.slug if q.team_id else f"{DEPARTMENT}{q.department.slug}", q.gpu_model)
            for q in Quota.objects.select_related("team", "department").order_by()}
    out: dict[str, list[Line]] = defaultdict(list)
    for s in engine_quotas.standings():
        out[s.unit].append(Line(s.unit, s.bucket, Amount.of(s.quota), Amount.of(s.used), Amount.of(s.borrowed),
                                Amount.of(s.lent), (s.unit, s.bucket) in rows))
    for lines in out.values():
        lines.sort(key=lambda line: (line.bucket != ANY_MODEL, line.bucket))
    return dict(out)


@dataclass
class Borrower:
    """A sibling of a unit that holds more than its own quota of a bucket now."""

    unit: str
    label: str
    bucket: str
    borrowed: Amount
    team: bool


def unit_parents() -> dict[str, str]:
    """Engine unit name → its parent's (\"\" for the organisation), from the departments and teams."""
    departments = dict(Department.objects.order_by().values_list("pk", "slug"))
    out = {f"{DEPARTMENT}{slug}": (f"{DEPARTMENT}{departments[parent]}" if parent else "")
           for slug, parent in Department.objects.order_by().values_list("slug", "parent_id")}
    for slug, department in Team.objects.order_by().values_list("slug", "department_id"):
        out[slug] = f"{DEPARTMENT}{departments[department]}" if department else ""
    return out


def unit_labels() -> dict[str, str]:
    labels = {f"{DEPARTMENT}{slug}": name for slug, name in Department.objects.order_by().values_list("slug", "name")}
    labels.update(Team.objects.order_by().values_list("slug", "name"))
    return labels


def _buckets() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for team, department, model in Quota.objects.order_by().values_list("team__slug", "department__slug", "gpu_model"):
        out[team if team is not None else f"{DEPARTMENT}{department}"].add(model)
    return out


def group_parent(unit: str, bucket: str, parents: dict[str, str], buckets: dict[str, set[str]]) -> str:
    """The unit whose children share `bucket` with `unit`, as the engine groups lenders and borrowers
    (scheduler.core.fairshare.standings): for `*`, its parent; for a model, its nearest department
    with a row covering the model (the model's or `*`), departments without one being transparent."""
    parent = parents.get(unit, "")
    if bucket == ANY_MODEL:
        return parent
    while parent and not ({bucket, ANY_MODEL} & buckets.get(parent, set())):
        parent = parents.get(parent, "")
    return parent


def borrowers_from(unit: str, lines: dict[str, list[Line]]) -> list[Borrower]:
    """The units that share a bucket group with `unit` (a bucket `unit` has a quota row for) and hold
    beyond their quota in it now: who borrows from the unused quota `unit` lends."""
    parents = unit_parents()
    buckets = _buckets()
    labels = unit_labels()
    out = []
    for bucket in sorted(buckets.get(unit, set()), key=lambda b: (b != ANY_MODEL, b)):
        group = group_parent(unit, bucket, parents, buckets)
        for other in sorted(lines):
            if other == unit:
                continue
            for line in lines[other]:
                if line.bucket == bucket and line.over and group_parent(other, bucket, parents, buckets) == group:
                    out.append(Borrower(other, labels.get(other, other), bucket, line.borrowed,
                                        not other.startswith(DEPARTMENT)))
    return out


@dataclass
class QuotaRow:
    """One quota row as the pages show it: amounts, limits (None: unlimited) and weight."""

    gpu_model: str
    gpu_share: Decimal
    gpu_memory_gib: Decimal
    gpus: int
    borrow: tuple = (None, None, None)
    lend: tuple = (None, None, None)
    weight: Decimal = Decimal("1.000")
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, q: Quota) -> QuotaRow:
        return cls(q.gpu_model, q.gpu_share, q.gpu_memory_gib, q.gpus,
                   tuple(getattr(q, "borrow_" + r) for r in RESOURCES),
                   tuple(getattr(q, "lend_" + r) for r in RESOURCES), q.weight)

    @property
    def memory_mib(self) -> int:
        return int(self.gpu_memory_gib * 1024)

    @property
    def borrow_text(self) -> str:
        return limit_text(self.borrow)

    @property
    def lend_text(self) -> str:
        return limit_text(self.lend)


def limit_text(values: tuple) -> str:
    if all(v is None for v in values):
        return "unlimited"
    share, gib, gpus = values
    parts = [f"{quota_number(share)} GPU" if share is not None else "",
             f"{quota_number(gib)} GiB" if gib is not None else "", f"{gpus} GPUs" if gpus is not None else ""]
    return ", ".join(p for p in parts if p) + " (the rest unlimited)" * any(v is None for v in values)


def quota_number(value) -> str:
    text = f"{Decimal(value):.3f}".rstrip("0").rstrip(".")
    return text or "0"


def rows_by_unit() -> dict[str, list[QuotaRow]]:
    """Engine unit name → its quota rows, `*` first then by model (two queries for the whole tree)."""
    out: dict[str, list[QuotaRow]] = defaultdict(list)
    for q in Quota.objects.select_related("team", "department").order_by():
        out[q.team.slug if q.team_id else f"{DEPARTMENT}{q.department.slug}"].append(QuotaRow.of(q))
    for rows in out.values():
        rows.sort(key=lambda r: (r.gpu_model != ANY_MODEL, r.gpu_model))
    return dict(out)


def rows_of(team: Team | None = None, department: Department | None = None) -> list[QuotaRow]:
    qs = Quota.objects.filter(team=team) if team is not None else Quota.objects.filter(department=department)
    return sorted((QuotaRow.of(q) for q in qs), key=lambda r: (r.gpu_model != ANY_MODEL, r.gpu_model))
