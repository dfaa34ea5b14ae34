"""What the data scientist's pages read: my reservations with where they run, my teams' quotas per
GPU model and what they hold of them, free capacity by GPU model, a reservation's usage over its
life. Read-only; every function takes the already tenancy-checked objects or the user whose view
it is."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Max, Prefetch, Q, Sum
from django.db.models.expressions import RawSQL
from django.utils import timezone

from portal import db_vendor
from portal.fleet.models import Gpu, NodeStatus
from portal.reservations import quota
from portal.reservations.models import COUNTED, Allocation, Reservation
from portal.reservations.states import ACTIVE, HOLDS_GPU
from portal.telemetry.models import RollupState, ShareMinute, ShareSample
from portal.tenancy import roles
from portal.tenancy.models import ANY_MODEL, Quota, Team, gib_to_mib

RECENT_ENDED = 10
CHART_POINTS = 240  # a chart over a reservation's whole life: buckets at most this many


def with_placement(qs):
    """Reservations with their node, team and live allocations (GPU and model) in three queries."""
    live = Allocation.objects.filter(released_at__isnull=True).select_related("gpu").order_by("gpu__index")
    return qs.select_related("team", "node", "client_node", "owner").prefetch_related(
        Prefetch("allocations", queryset=live, to_attr="live_allocations"))


def my_reservations(user) -> tuple[list[Reservation], list[Reservation]]:
    """(active, recently ended) reservations `user` owns, within the teams they may see."""
    mine = Reservation.objects.visible_to(user).filter(owner=user)
    active = list(with_placement(mine.filter(state__in=ACTIVE)).order_by("-created_at", "-id"))
    ended = list(mine.exclude(state__in=ACTIVE).select_related("team").order_by("-updated_at", "-id")[:RECENT_ENDED])
    return active, ended


@dataclass(frozen=True)
class BucketUse:
    """What a team holds (guaranteed + borrowed) of one of its quota buckets (a GPU model or `*`)."""

    bucket: str
    label: str
    quota_share: Decimal
    held_share: Decimal
    quota_memory_mib: int
    held_memory_mib: int
    quota_gpus: int
    held_gpus: int

    @property
    def borrowed_share(self) -> Decimal:
        return max(Decimal(0), self.held_share - self.quota_share)

    @property
    def meter_max(self) -> Decimal:
        return max(self.quota_share, self.held_share) or Decimal(1)

    @property
    def share_text(self) -> str:
        from .templatetags.tessera import share

        used, total = share(self.held_share), share(self.quota_share)
        if self.borrowed_share:
            return f"{used} of {total} GPU, {share(self.borrowed_share)} borrowed"
        return f"{used} of {total} GPU, {share(self.quota_share - self.held_share)} left"

    @property
    def memory_text(self) -> str:
        from .templatetags.tessera import gib

        return f"{gib(self.held_memory_mib)} of {gib(self.quota_memory_mib)} memory"


@dataclass(frozen=True)
class TeamQuota:
    team: Team
    role: str
    buckets: list[BucketUse]


def team_quotas(user) -> list[TeamQuota]:
    """Per team `user` belongs to (staff: none unless a member), each of its quota buckets with what
    the team holds in it that counts (guaranteed + borrowed); a model it holds without a row of its
    own nor a `*` row shows with quota 0."""
    memberships = roles.team_roles(user)
    teams = list(Team.objects.filter(pk__in=list(memberships)).order_by("slug"))
    rows: dict[int, dict[str, Quota]] = {t.pk: {} for t in teams}
    for q in Quota.objects.filter(team__in=teams).order_by():
        rows[q.team_id][q.gpu_model] = q
    out = []
    for team in teams:
        mine = rows[team.pk]
        held: dict[str, list] = {}
        for (_, model, admission), use in quota.held(team.pk).items():
            if admission not in COUNTED:
                continue
            bucket = model if model in mine else ANY_MODEL if ANY_MODEL in mine else model
            total = held.setdefault(bucket, [Decimal(0), 0, 0])
            total[0] += use.gpu_share
            total[1] += use.memory_mib
            total[2] += use.gpus
        buckets = []
        for bucket in sorted(set(mine) | set(held), key=lambda b: (b != ANY_MODEL, b)):
            q = mine.get(bucket)
            share_held, memory_held, gpus_held = held.get(bucket, (Decimal(0), 0, 0))
            label = bucket if bucket != ANY_MODEL else ("Any model" if len(mine) == 1 else "Any other model")
            buckets.append(BucketUse(bucket, label if q is not None else f"{bucket} (no quota)",
                                     q.gpu_share if q else Decimal(0), share_held,
                                     gib_to_mib(q.gpu_memory_gib) if q else 0, memory_held, q.gpus if q else 0,
                                     gpus_held))
        out.append(TeamQuota(team, memberships[team.pk], buckets))
    return out


@dataclass(frozen=True)
class ModelCapacity:
    model: str
    gpus: int
    free_gpus: int  # cards nobody holds a share of
    free_share: float  # the sum of what is left on every card
    largest_share: float  # the most one request could get on a single card
    largest_memory_mib: int  # the most memory one card still has


def free_capacity() -> list[ModelCapacity]:
    """Per GPU model, what could be placed now: healthy, uncordoned cards on ready nodes."""
    live = Q(allocations__released_at__isnull=True)
    rows = (Gpu.objects.filter(healthy=True, cordoned=False, node__status=NodeStatus.READY)
            .annotate(taken=Sum("allocations__gpu_request", filter=live),
                      memory_taken=Sum("allocations__gpu_memory_mib", filter=live),
                      holders=Count("allocations", filter=live))
            .values_list("model", "memory_mib", "taken", "memory_taken", "holders"))
    by_model: dict[str, list] = {}
    for model, memory, taken, memory_taken, holders in rows:
        entry = by_model.setdefault(model, [0, 0, 0.0, 0.0, 0])
        left = max(0.0, 1.0 - float(taken or 0))
        entry[0] += 1
        entry[1] += 0 if holders else 1
        entry[2] += left
        entry[3] = max(entry[3], left)
        entry[4] = max(entry[4], memory - int(memory_taken or 0))
    return [ModelCapacity(model, *values[:2], round(values[2], 3), round(values[3], 3), values[4])
            for model, values in sorted(by_model.items())]


def timeline(reservation: Reservation) -> list:
    return list(reservation.transitions.select_related(None).order_by("at", "id"))


def _bucket_expr(column: str, bucket_s: int) -> RawSQL:
    return db_vendor.of(connection).epoch_bucket(column, bucket_s)


def _add_buckets(buckets: dict[int, list], rows) -> None:
    for b, used_sum, samples, mem in rows:
        entry = buckets.setdefault(int(b), [0.0, 0, None])
        entry[0] += used_sum or 0.0
        entry[1] += samples or 0
        if mem is not None:
            entry[2] = max(entry[2] or 0, mem)


def _minute_buckets(reservation_id: int, start: datetime, end: datetime, bucket_s: int) -> dict[int, list]:
    rows = (ShareMinute.objects.filter(reservation_id=reservation_id, minute__gte=start, minute__lt=end)
            .annotate(b=_bucket_expr("minute", bucket_s)).values("b")
            .annotate(u=Sum("used_sum"), n=Sum("samples"), m=Max("mem_used_max")).values_list("b", "u", "n", "m"))
    buckets: dict[int, list] = {}
    _add_buckets(buckets, rows)
    return buckets


def usage_series(reservation: Reservation, now: datetime | None = None) -> dict:
    """Compute used (fraction of a GPU, the mean over the reservation's GPUs) and memory used
    (MiB, the most on any of its GPUs) over the reservation's life, in at most CHART_POINTS
    buckets: per-minute rollups, then the raw samples after the last rolled-up minute.

    The buckets wholly before the rollup horizon do not change (but for a late replay, which the
    rollup recomputes) and are cached for one bucket's length: a 30-day reservation's page reads
    its 43,200 minutes once, then only the minutes of the open bucket."""
    now = now or timezone.now()
    start = reservation.placed_at or reservation.created_at
    end = reservation.finished_at or now
    if end <= start:
        end = start + timedelta(minutes=1)
    span = (end - start).total_seconds()
    bucket_s = max(60, math.ceil(span / CHART_POINTS / 60.0) * 60)
    rolled_to = RollupState.objects.values_list("rolled_up_to", flat=True).first() or start
    first_minute = start.replace(second=0, microsecond=0)
    horizon = min(rolled_to, end + timedelta(minutes=1))
    closed_until = datetime.fromtimestamp(horizon.timestamp() // bucket_s * bucket_s, tz=horizon.tzinfo)
    key = f"web:usage:{reservation.pk}:{bucket_s}:{int(first_minute.timestamp())}:{int(closed_until.timestamp())}"
    buckets = cache.get(key)
    if buckets is None:
        buckets = _minute_buckets(reservation.pk, first_minute, closed_until, bucket_s)
        cache.set(key, buckets, timeout=bucket_s)
    buckets = {b: list(v) for b, v in buckets.items()}
    for b, v in _minute_buckets(reservation.pk, max(first_minute, closed_until), horizon, bucket_s).items():
        _add_buckets(buckets, [(b, *v)])
    if end > rolled_to:
        raw = (ShareSample.objects.filter(reservation=reservation, ts__gte=max(start, rolled_to), ts__lte=end)
               .annotate(b=_bucket_expr("ts", bucket_s)).values("b")
               .annotate(u=Sum("used_frac"), n=Count("id"), m=Max("mem_used_mib")).values_list("b", "u", "n", "m"))
        _add_buckets(buckets, raw)
    xs, used, memory = [], [], []
    for b in sorted(buckets):
        used_sum, samples, mem = buckets[b]
        xs.append(b)
        used.append(round(used_sum / samples * 100, 1) if samples else None)
        memory.append(round(mem / 1024, 2) if mem is not None else None)
    request = float(reservation.gpu_request) * 100
    limit = float(reservation.gpu_limit) * 100
    cap = round(reservation.gpu_memory_mib / 1024, 2)
    n = len(xs)
    return {
        "bucket_s": bucket_s,
        "compute": {"id": "chart-compute", "title": "GPU compute used (% of one GPU)", "unit": "%", "x": xs,
                    "ymax": limit,
                    "series": [{"key": "used", "label": "used", "values": used},
                               {"key": "request", "label": "request", "values": [request] * n, "dash": True},
                               {"key": "limit", "label": "limit", "values": [limit] * n, "dash": True}]},
        "memory": {"id": "chart-memory", "title": "GPU memory used (GiB)", "unit": "GiB", "x": xs, "ymax": cap,
                   "series": [{"key": "memory", "label": "used", "values": memory},
                              {"key": "limit", "label": "cap", "values": [cap] * n, "dash": True}]},
    }


def holds_gpu(reservation: Reservation) -> bool:
    return reservation.state in HOLDS_GPU
