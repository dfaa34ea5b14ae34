"""What reports read from telemetry: share and GPU sums over a window, from the hourly rollups for
the whole hours already folded and from the minute rollups for the rest (the window's ragged
edges and the hours not folded yet). Sums are in GPU-minutes, as the rollups keep them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import F, Sum
from django.db.models.functions import TruncHour

from portal.telemetry import hours
from portal.telemetry.models import GpuHour, RollupState, ShareHour

SHARE_MEASURES = tuple(hours.share_minute_sums())
GPU_MEASURES = tuple(hours.gpu_minute_sums())


def split(since: datetime, until: datetime) -> tuple[tuple[datetime, datetime] | None, list[tuple[datetime, datetime]]]:
    """([whole folded hours] or None, [minute spans]) covering [since, until) exactly once."""
    state = RollupState.objects.values_list("hours_rolled_up_to", flat=True).first()
    h0 = hours.ceil_hour(since)
    h1 = min(hours.floor_hour(until), state) if state else h0
    if h1 <= h0:
        return None, [(since, until)]
    return (h0, h1), [(a, b) for a, b in ((since, h0), (h1, until)) if b > a]


def share_sums(since: datetime, until: datetime, team_ids: list[int], by: tuple[str, ...]) -> dict[tuple, dict]:
    """key (values of `by`: reservation_id, gpu_id, team_id and/or "hour") → the share measures."""
    folded, minute_spans = split(since, until)
    parts = []
    if folded:
        parts.append(ShareHour.objects.filter(hour__gte=folded[0], hour__lt=folded[1], team_id__in=team_ids)
                     .annotate(h=F("hour")).values(*_fields(by)).annotate(**{f"t_{m}": Sum(m) for m in SHARE_MEASURES}))
    for a, b in minute_spans:
        parts.append(hours.share_minutes(a, b).filter(team_id__in=team_ids).annotate(h=TruncHour("minute"))
                     .values(*_fields(by)).annotate(**_totals(hours.share_minute_sums())))
    return _merge(parts, by, SHARE_MEASURES)


def gpu_sums(since: datetime, until: datetime, by: tuple[str, ...]) -> dict[tuple, dict]:
    """key (values of `by`: gpu_id and/or "hour") → device measures (all teams' work: staff only)."""
    folded, minute_spans = split(since, until)
    parts = []
    if folded:
        parts.append(GpuHour.objects.filter(hour__gte=folded[0], hour__lt=folded[1]).annotate(h=F("hour"))
                     .values(*_fields(by)).annotate(**{f"t_{m}": Sum(m) for m in GPU_MEASURES}))
    for a, b in minute_spans:
        parts.append(hours.gpu_minutes(a, b).annotate(h=TruncHour("minute")).values(*_fields(by))
                     .annotate(**_totals(hours.gpu_minute_sums())))
    return _merge(parts, by, GPU_MEASURES)


def _fields(by: tuple[str, ...]) -> list[str]:
    return ["h" if f == "hour" else f for f in by]


def _totals(sums: dict) -> dict:
    # Prefixed: an annotation may not share its name with a column (ShareHour.used).
    return {f"t_{m}": expr for m, expr in sums.items()}


def _merge(parts, by: tuple[str, ...], measures: tuple[str, ...]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = defaultdict(lambda: dict.fromkeys(measures, 0.0))
    for part in parts:
        for row in part:
            key = tuple(row["h" if f == "hour" else f] for f in by)
            acc = out[key]
            for m in measures:
                acc[m] += row[f"t_{m}"] or 0.0
    return dict(out)
