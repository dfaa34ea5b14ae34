"""The usage report's quota columns: quota, borrowed and lent GPU-hours per team and per department.

- **Quota GPU-hours**: the GPU share of the unit's *current* quota rows (every bucket: each GPU model
  and `*`) × the hours of the window up to now. Quota changes inside the window are not replayed:
  the rows as they are now stand for the whole window. A department without quota rows of its own
  counts as what its units claim of it (portal.tenancy.quota_tree's rule: its rows, plus, where it
  has no `*` row, its units' quotas for the models it has no row for).
- **Used (allocated) GPU-hours**: share × hours held (services.usage), as every report counts them.
- **Borrowed GPU-hours**: the allocated time of reservations admitted as borrowed (held beyond the
  team's quota, on what others lend); a department's is its teams'.
- **Lent GPU-hours**, hour by hour: through each hour of the window, in slots of 5 minutes (longer
  for long windows: see slot_length), what every team held that counts (guaranteed + borrowed, the
  slot's mean) is charged to the engine's ledger over the current quota tree, and
  `scheduler.core.fairshare.standings` tells what each unit lent: under each parent (per bucket),
  what the children hold beyond their quotas is split among the siblings with unused quota, in
  proportion to the unused quota each leaves (up to its lending limit). A team's lent GPU-hours are
  the compute part of that, summed over the slots. A department's are what it lent as a unit to
  its own siblings; a department without quota rows lends through its units, and its figure adds
  up theirs. Slots in which no borrowed reservation is held lend nothing (with quotas as they are,
  nothing is beyond a quota then) and are skipped.

Everyone's allocations enter the ledger (lending is between teams), but a report shows only the rows
of the teams the viewer may see (scope.py) and their departments.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Q

from portal.reservations import engine_quotas
from portal.reservations.models import COUNTED, Admission, Allocation
from portal.tenancy.models import ANY_MODEL, Department, Quota, Team
from scheduler.core import fairshare
from scheduler.core.model import MILLI

QUOTA_RULE = ("Quota GPU-hours: the GPU share of the current quota rows (every GPU model and *) × the window's hours "
              "up to now; quota changes inside the window are not replayed.")
LENT_RULE = ("Lent GPU-hours, hour by hour: what a unit's siblings held beyond their own quotas, taken from the "
             "siblings' unused quota in proportion to what each left unused (up to its lending limit), as the "
             "scheduler counts it, with the current quotas.")


@dataclass
class Tree:
    """Departments and teams with their current quota rows' GPU share, for the department rows."""

    parent: dict[str, str]  # engine unit name → its parent's ("" : the organisation)
    rows: dict[str, dict[str, Decimal]]  # unit → bucket → GPU share
    labels: dict[str, str]
    children: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def load(cls) -> Tree:
        departments = dict(Department.objects.order_by().values_list("pk", "slug"))
        parent, labels = {}, {}
        for slug, name, up in Department.objects.order_by().values_list("slug", "name", "parent_id"):
            unit = engine_quotas.unit_name(department=slug)
            parent[unit] = engine_quotas.unit_name(department=departments[up]) if up else ""
            labels[unit] = name or slug
        for slug, up in Team.objects.order_by().values_list("slug", "department_id"):
            parent[slug] = engine_quotas.unit_name(department=departments[up]) if up else ""
        rows: dict[str, dict[str, Decimal]] = defaultdict(dict)
        for team, department, model, share in Quota.objects.order_by().values_list(
                "team__slug", "department__slug", "gpu_model", "gpu_share"):
            rows[team if team is not None else engine_quotas.unit_name(department=department)][model] = share
        tree = cls(parent, rows, labels)
        for unit, up in parent.items():
            tree.children[up].append(unit)
        return tree

    def claims(self, unit: str) -> dict[str, Decimal]:
        """What `unit` claims of its parent, per bucket (quota_tree's rule, GPU share only)."""
        out = dict(self.rows.get(unit, {}))
        if unit.startswith(engine_quotas.DEPARTMENT) and ANY_MODEL not in out:
            for child in self.children.get(unit, ()):
                for model, share in self.claims(child).items():
                    if model not in self.rows.get(unit, {}):
                        out[model] = out.get(model, Decimal(0)) + share
        return out

    def quota_share(self, unit: str) -> float:
        return float(sum(self.claims(unit).values(), Decimal(0)))

    def ancestors(self, unit: str) -> list[str]:
        """The departments above `unit`, nearest first."""
        out = []
        up = self.parent.get(unit, "")
        while up and up not in out:
            out.append(up)
            up = self.parent.get(up, "")
        return out

    def lent(self, unit: str, by_unit: dict[str, float]) -> float:
        """A department's lent GPU-hours: its own, or (without rows) its units' added up."""
        if not unit.startswith(engine_quotas.DEPARTMENT) or self.rows.get(unit):
            return by_unit.get(unit, 0.0)
        return sum(self.lent(child, by_unit) for child in self.children.get(unit, ()))

    def path_label(self, unit: str) -> str:
        """Its departments from the top, "Research › Language" ("" under the organisation)."""
        return " › ".join(self.labels.get(d, d) for d in reversed(self.ancestors(unit)))


def effective_hours(since: datetime, until: datetime, now: datetime) -> float:
    return max(0.0, (min(until, now) - since).total_seconds() / 3600.0)


MAX_SLOTS = 720  # the ledger is worked out at most this many times per report (a few ms each)
MIN_SLOT = timedelta(minutes=5)


def slot_length(since: datetime, end: datetime) -> timedelta:
    """5 minutes, or longer (in whole 5 minutes) so that the window has at most MAX_SLOTS slots:
    5 min for a day, 15 for a week, an hour for 30 days."""
    slots = -(-(end - since) // MIN_SLOT)  # ceil
    return MIN_SLOT * max(1, -(-slots // MAX_SLOTS))


def _slots(since: datetime, end: datetime) -> list[datetime]:
    """Slot edges from the whole hour before `since`, cut to the window."""
    step = slot_length(since, end)
    at = since.replace(minute=0, second=0, microsecond=0)
    edges = [since]
    while (at := at + step) < end:
        if at > since:
            edges.append(at)
    edges.append(end)
    return edges


def lent_hours(since: datetime, until: datetime, now: datetime) -> dict[str, float]:
    """Engine unit name → the GPU-hours of compute it lent in [since, min(until, now)) (see above).

    The window is cut into slots (slot_length: 5 minutes for a day's report, an hour for a month's)
    and in each slot with a borrowed reservation held the ledger is charged with what every team
    held on average in it; slots with the same holding (a long run of unchanged ones) cost one. A
    holding that changes inside a slot counts with its mean: what starts and ends within one slot of
    each other may be seen only in part."""
    end = min(until, now)
    if end <= since:
        return {}
    rows = list(Allocation.objects.filter(Q(released_at__isnull=True) | Q(released_at__gt=since), created_at__lt=end,
                                          reservation__admission__in=COUNTED)
                .values_list("reservation__team__slug", "gpu__model", "reservation__admission", "gpu_request",
                             "gpu_memory_mib", "created_at", "released_at"))
    if not any(r[2] == Admission.BORROWED for r in rows):
        return {}
    edges = _slots(since, end)
    n = len(edges) - 1

    def span(start: datetime, stop: datetime) -> range:
        last = bisect_right(edges, stop - timedelta(microseconds=1))
        return range(max(0, bisect_right(edges, start) - 1), min(n, last))

    lending = [False] * n  # slots in which some borrowed reservation is held
    for _, _, admission, _, _, created, released in rows:
        if admission == Admission.BORROWED:
            for i in span(max(created, since), min(released or end, end)):
                lending[i] = True
    held: list[dict[tuple[str, str, str], list[float]]] = [defaultdict(lambda: [0.0, 0.0, 0.0]) for _ in range(n)]
    for team, model, admission, share, memory, created, released in rows:
        start, stop = max(created, since), min(released or end, end)
        for i in span(start, stop):
            if lending[i]:
                seconds = (min(stop, edges[i + 1]) - max(start, edges[i])).total_seconds()
                total = held[i][(team, model, admission)]
                total[0] += float(share) * MILLI * seconds
                total[1] += memory * seconds
                total[2] += seconds
    tree = engine_quotas.load()
    out: dict[str, float] = defaultdict(float)
    seen: dict[tuple, dict[str, float]] = {}
    for i in range(n):
        if not lending[i]:
            continue
        length = (edges[i + 1] - edges[i]).total_seconds()
        holding = tuple(sorted((key, round(v[0] / length, 3), round(v[1] / length, 3), round(v[2] / length, 6))
                               for key, v in held[i].items()))
        lent = seen.get(holding)
        if lent is None:
            lent = seen[holding] = _lent_rates(tree, holding)
        for unit, milli in lent.items():
            out[unit] += milli / MILLI * length / 3600.0
    return dict(out)


def _lent_rates(tree: fairshare.QuotaTree, rates: tuple) -> dict[str, float]:
    """Unit → compute (milli) it lends while teams hold `rates` ((team, model, admission), milli, MiB, GPUs)."""
    ledger = fairshare.Ledger(tree, {model: fairshare.ZERO for (_, model, _), *_ in rates}, ())
    for j, ((team, model, admission), milli, memory, gpus) in enumerate(rates):
        if team in tree.units:
            ledger.charge(f"r{j}", team, model, (milli, memory, gpus), fairshare.Admission(admission))
    out: dict[str, float] = defaultdict(float)
    for s in fairshare.standings(ledger):
        if s.lent[0] > 0:
            out[s.unit] += s.lent[0]
    return dict(out)
