"""What reports read from telemetry: share and GPU sums over a window, from the hourly rollups for
the whole hours already folded and from the minute rollups for the rest (the window's ragged
edges and the hours not folded yet). Sums are in GPU-minutes, as the rollups keep them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import Case, F, IntegerField, Sum, Value, When
from django.db.models.functions import TruncHour

from portal.fleet.models import awaiting_approval
from portal.telemetry import hours
from portal.telemetry.models import GpuDay, GpuHour, RollupState, ShareHour

SHARE_MEASURES = tuple(hours.share_minute_sums())


def split(since: datetime, until: datetime) -> tuple[tuple[datetime, datetime] | None, list[tuple[datetime, datetime]]]:
    """([whole folded hours] or None, [minute spans]) covering [since, until) exactly once."""
    state = RollupState.objects.values_list("hours_rolled_up_to", flat=True).first()
    h0 = hours.ceil_hour(since)
    h1 = min(hours.floor_hour(until), state) if state else h0
    if h1 <= h0:
        return None, [(since, until)]
    return (h0, h1), [(a, b) for a, b in ((since, h0), (h1, until)) if b > a]


def share_sums(since: datetime, until: datetime, team_ids: list[int], by: tuple[str, ...],
               edges: list[datetime] | None = None) -> dict[tuple, dict]:
    """key (values of `by`: reservation_id, gpu_id, team_id, "hour" and/or "bucket", the index of
    the chart bucket among `edges`) → the share measures. Buckets are counted by the database: a
    month by hour and team is 14,000 rows, which cost more to fetch than to sum."""
    folded, minute_spans = split(since, until)
    parts = []
    if folded:
        parts.append(ShareHour.objects.filter(hour__gte=folded[0], hour__lt=folded[1], team_id__in=team_ids)
                     .annotate(h=F("hour"), bucket=_bucket("hour", edges)).values(*_fields(by))
                     .annotate(**{f"t_{m}": Sum(m) for m in SHARE_MEASURES}))
    for a, b in minute_spans:
        parts.append(hours.share_minutes(a, b).filter(team_id__in=team_ids)
                     .annotate(h=TruncHour("minute"), bucket=_bucket("minute", edges))
                     .values(*_fields(by)).annotate(**_totals(hours.share_minute_sums())))
    return _merge(parts, by, SHARE_MEASURES)


def _bucket(field: str, edges: list[datetime] | None):
    """The chart bucket a row falls in (an hour row by its start): 0 … len(edges) - 2."""
    if not edges or len(edges) < 3:
        return Value(0)
    return Case(*[When(**{f"{field}__lt": edge}, then=Value(i)) for i, edge in enumerate(edges[1:-1])],
                default=Value(len(edges) - 2), output_field=IntegerField())


def gpu_busy(since: datetime, until: datetime, key: str) -> dict[str, float]:
    """`key` (a GPU field such as gpu__node__name or gpu__model) → device busy GPU-minutes, every
    team's work (site admins only), of the fleet's GPUs: not those awaiting approval, whose agent
    alone says they exist. Whole UTC days come from the day rows, the rest from hours and minutes
    as for shares; the database groups by the key, so a month for 4,000 GPUs sends back one row
    per node or model, not per GPU and part."""
    folded_hours = RollupState.objects.values_list("hours_rolled_up_to", flat=True).first()
    d0 = hours.ceil_day(since)
    d1 = min(hours.floor_day(until), hours.floor_day(folded_hours)) if folded_hours else d0
    parts, spans = [], [(since, until)]
    unapproved = awaiting_approval("gpu__")
    if d1 > d0:
        parts.append(GpuDay.objects.filter(day__gte=d0, day__lt=d1).exclude(unapproved).values(key)
                     .annotate(t=Sum("busy")))
        spans = [(a, b) for a, b in ((since, d0), (d1, until)) if b > a]
    for since_, until_ in spans:
        folded, minute_spans = split(since_, until_)
        if folded:
            parts.append(GpuHour.objects.filter(hour__gte=folded[0], hour__lt=folded[1]).exclude(unapproved)
                         .values(key).annotate(t=Sum("busy")))
        for a, b in minute_spans:
            parts.append(hours.gpu_minutes(a, b).exclude(unapproved).values(key)
                         .annotate(t=hours.gpu_minute_sums()["busy"]))
    out: dict[str, float] = defaultdict(float)
    for part in parts:
        for k, busy in part.values_list(key, "t"):
            out[k] += busy or 0.0
    return dict(out)


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
