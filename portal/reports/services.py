"""Utilization reports: GPU time allocated versus GPU time really used, per team, node or GPU.

Allocated time comes from the allocation rows (share × how long it was held within the window);
used time from the telemetry's per-minute rollups (the mean fraction of a GPU a share used in each
minute), so a report over months reads minutes, never raw samples. A user sees only the shares of
the teams they may see; the GPU-wide device load is shown to site admins only, since it includes
other teams' work.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F, FloatField, Q, Sum, Value
from django.db.models.functions import Cast, Least

from portal.reservations.models import Allocation
from portal.telemetry.models import GpuMinute, ShareMinute
from portal.tenancy import roles

GROUPS = ("team", "node", "gpu")
ALLOCATION_KEY = {"team": "reservation__team__slug", "node": "gpu__node__name", "gpu": "gpu__uuid"}
MINUTE_KEY = {"team": "reservation__team__slug", "node": "gpu__node__name", "gpu": "gpu__uuid"}


@dataclass
class Row:
    key: str
    allocated_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    device_busy_gpu_hours: float | None = None

    @property
    def used_pct(self) -> float | None:
        if self.allocated_gpu_hours <= 0:
            return None
        return round(100.0 * self.used_gpu_hours / self.allocated_gpu_hours, 1)

    def as_dict(self) -> dict:
        return {"key": self.key, "allocated_gpu_hours": round(self.allocated_gpu_hours, 4),
                "used_gpu_hours": round(self.used_gpu_hours, 4), "used_pct": self.used_pct,
                "device_busy_gpu_hours": None if self.device_busy_gpu_hours is None
                else round(self.device_busy_gpu_hours, 4)}


def utilization(user, group_by: str, since: datetime, until: datetime) -> list[Row]:
    if group_by not in GROUPS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}")
    rows: dict[str, Row] = defaultdict(lambda: Row(key=""))
    teams = None if user.is_staff else list(roles.visible_teams(user).values_list("pk", flat=True))

    allocations = Allocation.objects.filter(Q(released_at__isnull=True) | Q(released_at__gt=since),
                                            created_at__lt=until)
    minutes = ShareMinute.objects.filter(minute__gte=since, minute__lt=until)
    if teams is not None:
        allocations = allocations.filter(reservation__team_id__in=teams)
        minutes = minutes.filter(team_id__in=teams)

    for key, share, start, end in allocations.values_list(ALLOCATION_KEY[group_by], "compute_share",
                                                          "created_at", "released_at"):
        held = (min(end or until, until) - max(start, since)).total_seconds()
        if held > 0:
            rows[key].allocated_gpu_hours += float(share) * held / 3600.0

    # Each minute contributes its mean used fraction for the part of the minute that has samples
    # (agents sample once a second), so a share placed at :50 counts ten seconds, not sixty.
    coverage = Least(Cast(F("samples"), FloatField()), Value(60.0)) / Value(60.0)
    per_minute = Cast(F("used_sum"), FloatField()) / Cast(F("samples"), FloatField()) * coverage
    for row in (minutes.filter(samples__gt=0).values(MINUTE_KEY[group_by])
                .annotate(used=Sum(per_minute))):
        rows[row[MINUTE_KEY[group_by]]].used_gpu_hours += (row["used"] or 0.0) / 60.0

    if user.is_staff and group_by in ("node", "gpu"):
        key = "gpu__node__name" if group_by == "node" else "gpu__uuid"
        busy = Cast(F("sm_util_sum"), FloatField()) / Cast(F("sm_util_count"), FloatField()) / 100.0
        for row in (GpuMinute.objects.filter(minute__gte=since, minute__lt=until, sm_util_count__gt=0)
                    .values(key).annotate(busy=Sum(busy))):
            rows[row[key]].device_busy_gpu_hours = (row["busy"] or 0.0) / 60.0

    for key, row in rows.items():
        row.key = key
    return sorted(rows.values(), key=lambda r: (-r.allocated_gpu_hours, r.key))
