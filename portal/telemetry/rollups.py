"""Per-minute rollups (folded into hours and days by hours.py) and retention of the telemetry rows.

Each step is idempotent: a rollup recomputes whole minutes from the raw rows and upserts them, so
running twice, or two runs racing, gives the same rows. upkeep.py runs them periodically.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, F, FloatField, Max, Sum, Value
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone

from . import conf, hours
from .ingest import ROLLUP_SETTLE
from .models import GpuDay, GpuHour, GpuMinute, GpuSample, LateMinute, RollupState, ShareHour, ShareMinute, ShareSample

# A minute is rolled up this long after it ends: batches still in flight (the agent sends each
# sample as it is taken, the writer commits within a fraction of a second) land first.
SETTLE = ROLLUP_SETTLE
# One run rolls up at most this much, so a portal back after a long stop catches up in steps.
MAX_SPAN = timedelta(hours=2)

_GPU_FIELDS = ["samples", "sm_util_sum", "sm_util_count", "sm_util_max", "mem_used_sum", "mem_used_max",
               "power_sum", "power_count", "temp_max"]
_SHARE_FIELDS = ["team_id", "samples", "used_sum", "used_max", "mem_used_max"]


def _floor(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def roll_up_span(start: datetime, end: datetime) -> int:
    """Recompute the rollups of every minute in [start, end) from the raw rows; returns rows written."""
    gpu_rows = [
        GpuMinute(gpu_id=r["gpu_id"], minute=r["m"], **{f: r[f] for f in _GPU_FIELDS})
        for r in GpuSample.objects.filter(ts__gte=start, ts__lt=end)
        .annotate(m=TruncMinute("ts")).values("gpu_id", "m")
        .annotate(samples=Count("id"), sm_util_sum=Coalesce(Sum("sm_util_pct"), 0),
                  sm_util_count=Count("sm_util_pct"), sm_util_max=Max("sm_util_pct"),
                  mem_used_sum=Sum("mem_used_mib"), mem_used_max=Max("mem_used_mib"),
                  power_sum=Coalesce(Sum("power_w"), Value(0.0), output_field=FloatField()),
                  power_count=Count("power_w"), temp_max=Max("temp_c"))
    ]
    share_rows = [
        ShareMinute(reservation_id=r["reservation_id"], gpu_id=r["gpu_id"], minute=r["m"],
                    **{f: r[f] for f in _SHARE_FIELDS})
        for r in ShareSample.objects.filter(ts__gte=start, ts__lt=end)
        .annotate(m=TruncMinute("ts"), team_id=F("reservation__team_id"))
        .values("reservation_id", "gpu_id", "m", "team_id")
        .annotate(samples=Count("id"), used_sum=Sum("used_frac"), used_max=Max("used_frac"),
                  mem_used_max=Max("mem_used_mib"))
    ]
    GpuMinute.objects.bulk_create(gpu_rows, batch_size=2000, update_conflicts=True,
                                  unique_fields=["gpu", "minute"], update_fields=_GPU_FIELDS)
    ShareMinute.objects.bulk_create(share_rows, batch_size=2000, update_conflicts=True,
                                    unique_fields=["reservation", "gpu", "minute"], update_fields=_SHARE_FIELDS)
    return len(gpu_rows) + len(share_rows)


def roll_up(now: datetime | None = None) -> int:
    """Roll up the minutes completed since the last run, then the minutes that received late
    samples (a replay after an outage). Returns the rollup rows written."""
    now = now or timezone.now()
    end = _floor(now - SETTLE)
    written = 0
    with transaction.atomic():
        state = RollupState.objects.select_for_update().first() or RollupState.objects.create(rolled_up_to=None)
        start = state.rolled_up_to
        if start is None:
            oldest = GpuSample.objects.order_by("ts").values_list("ts", flat=True).first()
            start = _floor(oldest) if oldest else end
        stop = min(end, start + MAX_SPAN)
        if stop > start:
            written += roll_up_span(start, stop)
            state.rolled_up_to = stop
            state.save(update_fields=["rolled_up_to"])
        late = list(LateMinute.objects.filter(minute__lt=state.rolled_up_to or stop)
                    .values_list("pk", "minute"))
        for _pk, minute in late:
            written += roll_up_span(minute, minute + timedelta(minutes=1))
        LateMinute.objects.filter(pk__in=[pk for pk, _ in late]).delete()
        written += _fold_hours(state, {hours.floor_hour(m) for _pk, m in late})
    return written


def _fold_hours(state: RollupState, late_hours: set[datetime]) -> int:
    """Fold the hours whose minutes are all rolled up into the hourly rows, and again the hours
    that just had a late minute recomputed. Called under the RollupState lock."""
    written = 0
    if state.rolled_up_to is None:
        return 0
    done = hours.floor_hour(state.rolled_up_to)
    start = state.hours_rolled_up_to
    if start is None:
        oldest = ShareMinute.objects.order_by("minute").values_list("minute", flat=True).first()
        oldest_gpu = GpuMinute.objects.order_by("minute").values_list("minute", flat=True).first()
        firsts = [m for m in (oldest, oldest_gpu) if m is not None]
        start = hours.floor_hour(min(firsts)) if firsts else done
    stop = min(done, start + MAX_SPAN)
    if stop > start:
        written += hours.fold(start, stop)
        state.hours_rolled_up_to = stop
        state.save(update_fields=["hours_rolled_up_to"])
    for hour in sorted(late_hours):
        if state.hours_rolled_up_to is not None and hour < state.hours_rolled_up_to:
            written += hours.fold(hour, hour + hours.HOUR, folded_to=state.hours_rolled_up_to)
    return written


def apply_retention(now: datetime | None = None) -> dict[str, int]:
    """Delete raw rows past raw retention (never before they are rolled up) and minutes past
    minute retention. Returns how many rows of each kind went."""
    now = now or timezone.now()
    state = RollupState.objects.first()
    minute_cutoff = now - conf.minute_retention()
    hour_cutoff = now - conf.hour_retention()
    deleted = {"gpu_samples": 0, "share_samples": 0, "late_minutes": 0}
    if state is not None and state.rolled_up_to is not None:
        raw_cutoff = min(now - conf.raw_retention(), state.rolled_up_to)
        deleted = {
            "gpu_samples": GpuSample.objects.filter(ts__lt=raw_cutoff).delete()[0],
            "share_samples": ShareSample.objects.filter(ts__lt=raw_cutoff).delete()[0],
            "late_minutes": LateMinute.objects.filter(minute__lt=raw_cutoff).delete()[0],
        }
    return {
        **deleted,
        "gpu_minutes": GpuMinute.objects.filter(minute__lt=minute_cutoff).delete()[0],
        "share_minutes": ShareMinute.objects.filter(minute__lt=minute_cutoff).delete()[0],
        "gpu_hours": GpuHour.objects.filter(hour__lt=hour_cutoff).delete()[0],
        "share_hours": ShareHour.objects.filter(hour__lt=hour_cutoff).delete()[0],
        "gpu_days": GpuDay.objects.filter(day__lt=hour_cutoff).delete()[0],
    }
