"""What is booked over a span of time, as the calendar page, the bookings API and the iCal feed
show it: the bookings a user may see (their teams' reservations: members their own team's,
managers the teams they manage, site admins all) and, per GPU model, the fleet's cards, the most
of them booked at once and the drains planned on them (the dips in what can be booked): that side
only to site admins and team managers (`sees_fleet`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Sum

from portal.fleet import drain_plans
from portal.fleet.models import Gpu
from portal.tenancy import roles
from portal.tenancy.models import Role

from .models import Reservation
from .services.booking import TAKING

LONGEST_SPAN = timedelta(days=92)


@dataclass(frozen=True)
class ModelLoad:
    """One GPU model over the span: its cards, and the most booked at once (compute share,
    memory, GPUs) among the bookings shown."""

    gpu_model: str
    gpus: int
    memory_gib: int
    peak_gpu_share: Decimal
    peak_memory_gib: int
    peak_gpus: int

    @property
    def high(self) -> float:
        """Where a meter of this model's booked GPUs turns to a warning: 80 % of its cards."""
        return 0.8 * self.gpus


def sees_fleet(user) -> bool:
    """Whether `user` sees the fleet's side of the calendar (per GPU model: its cards, the peak
    booked, the drains planned): site admins, and the managers and admins of a team."""
    return roles.is_site_admin(user) or bool({Role.ADMIN, Role.MANAGER} & set(roles.team_roles(user).values()))


def bookings_of(user, start: datetime, end: datetime, gpu_model: str = "", mine: bool = False):
    """The bookings `user` may see whose window meets [start, end): booked ones and the
    reservations they became while those run; earliest first."""
    rows = (Reservation.objects.visible_to(user)
            .filter(starts_at__isnull=False, starts_at__lt=end, ends_at__gt=start, state__in=TAKING)
            .select_related("team", "owner").order_by("starts_at", "pk"))
    if gpu_model:
        rows = rows.filter(gpu_model=gpu_model)
    if mine:
        rows = rows.filter(owner=user)
    return rows


def load_by_model(bookings, gpu_model: str = "") -> list[ModelLoad]:
    """Per GPU model of the fleet (or the one named): its cards and the peak of `bookings`."""
    fleet = Gpu.objects.order_by().values("model").annotate(n=Count("id"), memory=Sum("memory_mib"))
    if gpu_model:
        fleet = fleet.filter(model=gpu_model)
    by_model: dict[str, list[Reservation]] = defaultdict(list)
    for r in bookings:
        by_model[r.gpu_model].append(r)
    out = []
    for row in sorted(fleet, key=lambda r: r["model"]):
        share, memory, gpus = _peak(by_model.get(row["model"], []))
        out.append(ModelLoad(row["model"], row["n"], (row["memory"] or 0) // 1024, share, memory // 1024, gpus))
    return out


@dataclass(frozen=True)
class DayLoad:
    """One day: per model of `models`, the most of it booked at once (GPU share) that day."""

    day: datetime
    cells: list[tuple[ModelLoad, Decimal]]


def by_day(bookings, models: list[ModelLoad], start: datetime, days: int) -> list[DayLoad]:
    """The peak booked each day from `start` (midnight UTC), per model; days with none left out."""
    out = []
    for i in range(days):
        lo, hi = start + timedelta(days=i), start + timedelta(days=i + 1)
        cells = []
        for m in models:
            active = [r for r in bookings if r.gpu_model == m.gpu_model and r.starts_at < hi and r.ends_at > lo]
            cells.append((m, _peak(active, lo)[0]))
        if any(share for _, share in cells):
            out.append(DayLoad(lo, cells))
    return out


def _peak(bookings: list[Reservation], since: datetime | None = None) -> tuple[Decimal, int, int]:
    best = (Decimal(0), 0, 0)
    for at in {max(r.starts_at, since) if since else r.starts_at for r in bookings}:
        active = [r for r in bookings if r.starts_at <= at < r.ends_at]
        total = (sum((r.gpu_request * r.gpu_count for r in active), Decimal(0)),
                 sum(r.gpu_memory_mib * r.gpu_count for r in active), sum(r.gpu_count for r in active))
        best = max(best, total)
    return best


@dataclass(frozen=True)
class DrainDip:
    """A planned drain as the calendar shows it: the model's cards it takes out over its window."""

    gpu_model: str
    node: str
    when: str
    starts_at: datetime
    out: int  # the model's GPUs on the node
    of: int  # the model's GPUs in the fleet
    reason: str
    ends_at: datetime | None  # None: until a person returns the node
    plan: int  # the PlannedDrain's id

    @property
    def left(self) -> int:
        return self.of - self.out


def drain_dips(start: datetime, end: datetime, gpu_model: str = "") -> list[DrainDip]:
    """Per GPU model (or the one named), the drains planned over [start, end), earliest first."""
    plans = list(drain_plans.overlapping(start, end).select_related("node").order_by("starts_at", "pk"))
    if not plans:
        return []
    per_node = defaultdict(dict)
    for node_id, model, n in (Gpu.objects.filter(node_id__in={p.node_id for p in plans}).order_by()
                              .values_list("node_id", "model").annotate(n=Count("id"))):
        per_node[node_id][model] = n
    totals = dict(Gpu.objects.order_by().values_list("model").annotate(n=Count("id")))
    return [DrainDip(model, p.node.name, drain_plans.window_text(p.starts_at, p.ends_at), p.starts_at, n,
                     totals.get(model, n), p.reason, p.ends_at, p.pk)
            for p in plans for model, n in sorted(per_node[p.node_id].items()) if not gpu_model or model == gpu_model]
