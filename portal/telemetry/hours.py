"""Hourly rollups: the per-minute rollups folded into hours, which long reports read.

The same per-minute arithmetic serves the fold and the reports' ragged edges (a window starting
at 09:17 reads its first 43 minutes from the minute rows), so an hour read from ShareHour and the
same hour read from ShareMinute give the same numbers.

Per minute, a share's mean use is used_sum / samples (a fraction of the GPU) and the minute
counts for the part of it that has samples (agents sample about once a second, so a share
placed at :50 counts ten seconds, not sixty). A minute is idle when that mean is under the team's
idle threshold, and bursts when it is above the share's request.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import Case, F, FloatField, Sum, Value, When
from django.db.models.functions import Cast, Greatest, Least, TruncHour
from django.db.models.lookups import LessThan

from .models import GpuDay, GpuHour, GpuMinute, ShareHour, ShareMinute

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def _float(name: str):
    return Cast(F(name), FloatField())


def _coverage():
    """The part of a minute row that has samples (a row of 60 or more counts whole): every sum
    over minute rows is weighted by it."""
    return Least(_float("samples"), Value(60.0)) / Value(60.0)


def share_minute_sums() -> dict:
    """Aggregates over ShareMinute rows, in GPU-minutes, named as ShareHour's columns."""
    coverage = _coverage()
    mean = _float("used_sum") / _float("samples")
    request = _float("reservation__gpu_request")
    idle = LessThan(mean, _float("reservation__team__idle_threshold"))
    return {
        "sampled_minutes": Sum(coverage),
        "used": Sum(mean * coverage),
        "idle_allocated": Sum(Case(When(idle, then=coverage * request), default=Value(0.0),
                                   output_field=FloatField())),
        "over_request": Sum(Greatest(mean - request, Value(0.0)) * coverage),
    }


def share_minute_allocated() -> Sum:
    """GPU-minutes the same ShareMinute rows held allocated (each share's request, weighted as `used`
    is): the denominator that makes used ÷ allocated a ratio over one window and one set of shares."""
    return Sum(_coverage() * _float("reservation__gpu_request"))


def gpu_minute_sums() -> dict:
    """Aggregates over GpuMinute rows, in GPU-minutes, named as GpuHour's columns."""
    coverage = _coverage()
    busy = _float("sm_util_sum") / _float("sm_util_count") / Value(100.0)
    return {"sampled_minutes": Sum(coverage), "busy": Sum(busy * coverage)}


def share_minutes(start: datetime, end: datetime):
    return ShareMinute.objects.filter(minute__gte=start, minute__lt=end, samples__gt=0)


def gpu_minutes(start: datetime, end: datetime):
    return GpuMinute.objects.filter(minute__gte=start, minute__lt=end, sm_util_count__gt=0)


def fold(start: datetime, end: datetime, folded_to: datetime | None = None) -> int:
    """(Re)compute the hour rows of every hour in [start, end) (whole hours) from the minute rows,
    then the GPU day rows of the days it touched that are complete (every hour before
    max(end, folded_to) folded); returns rows written. Idempotent: an hour is replaced whole."""
    share_rows = [
        ShareHour(reservation_id=r["reservation_id"], gpu_id=r["gpu_id"], team_id=r["team_id"], hour=r["h"],
                  **{k: r[k] for k in share_minute_sums()})
        for r in share_minutes(start, end).annotate(h=TruncHour("minute"))
        .values("reservation_id", "gpu_id", "team_id", "h").annotate(**share_minute_sums())
    ]
    gpu_rows = [
        GpuHour(gpu_id=r["gpu_id"], hour=r["h"], **{k: r[k] for k in gpu_minute_sums()})
        for r in gpu_minutes(start, end).annotate(h=TruncHour("minute")).values("gpu_id", "h")
        .annotate(**gpu_minute_sums())
    ]
    # An hour recomputed after a late minute may have lost a share (its only minute moved): the
    # hour is replaced whole, not merged.
    ShareHour.objects.filter(hour__gte=start, hour__lt=end).delete()
    GpuHour.objects.filter(hour__gte=start, hour__lt=end).delete()
    ShareHour.objects.bulk_create(share_rows, batch_size=2000)
    GpuHour.objects.bulk_create(gpu_rows, batch_size=2000)
    done = max(end, folded_to or end)
    day = floor_day(start)
    written = len(share_rows) + len(gpu_rows)
    while day < end:
        if day + DAY <= done:
            written += fold_day(day)
        day += DAY
    return written


def fold_day(day: datetime) -> int:
    """(Re)compute the GPU day rows of one UTC day from its hour rows."""
    rows = [GpuDay(gpu_id=r["gpu_id"], day=day, sampled_minutes=r["s"], busy=r["b"])
            for r in GpuHour.objects.filter(hour__gte=day, hour__lt=day + DAY).values("gpu_id")
            .annotate(s=Sum("sampled_minutes"), b=Sum("busy"))]
    GpuDay.objects.filter(day=day).delete()
    GpuDay.objects.bulk_create(rows, batch_size=5000)
    return len(rows)


def floor_day(at: datetime) -> datetime:
    """00:00 UTC of the day of `at` (days of the rollups are UTC days, whatever a report's zone)."""
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def ceil_day(at: datetime) -> datetime:
    floor = floor_day(at)
    return floor if floor == at else floor + DAY


def floor_hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def ceil_hour(at: datetime) -> datetime:
    floor = floor_hour(at)
    return floor if floor == at else floor + HOUR
