"""A report's time window: [since, until) in UTC, the time zone its buckets and dates are read
in, and the chart buckets (hours, quarter days or days of that zone's wall clock)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
# Bucket width by window span: a chart of 24 to 60 points, whatever the window.
BUCKETS = ((timedelta(days=2), 1), (timedelta(days=14), 6), (None, 24))  # (span up to, hours)


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime
    tz: ZoneInfo

    @property
    def hours(self) -> float:
        return (self.until - self.since).total_seconds() / 3600.0

    @property
    def bucket_hours(self) -> int:
        span = self.until - self.since
        return next(h for limit, h in BUCKETS if limit is None or span <= limit)

    def edges(self) -> list[datetime]:
        """Bucket boundaries in UTC: since, then each whole bucket of the zone's wall clock, until.
        Stepped in wall-clock time, so a day bucket stays midnight to midnight across DST."""
        step = self.bucket_hours
        local = self.since.astimezone(self.tz)
        start = local.replace(hour=local.hour // step * step if step < 24 else 0, minute=0, second=0,
                              microsecond=0, tzinfo=None)
        edges = [self.since]
        k = 1
        while True:
            wall = start + timedelta(hours=step * k)
            at = wall.replace(tzinfo=self.tz).astimezone(self.since.tzinfo)
            if at >= self.until:
                break
            if at > edges[-1]:
                edges.append(at)
            k += 1
        edges.append(self.until)
        return edges


def bucket_of(edges: list[datetime], at: datetime) -> int:
    """Index of the bucket that holds `at` (clamped into the window)."""
    return min(max(bisect_right(edges, at) - 1, 0), len(edges) - 2)


def spread(edges: list[datetime], start: datetime, end: datetime, rate: float) -> list[float]:
    """rate × hours of [start, end) falling into each bucket (start, end already clipped)."""
    out = [0.0] * (len(edges) - 1)
    if end <= start:
        return out
    first, last = bucket_of(edges, start), bucket_of(edges, end - timedelta(microseconds=1))
    for i in range(first, last + 1):
        lo, hi = max(start, edges[i]), min(end, edges[i + 1])
        out[i] = rate * (hi - lo).total_seconds() / 3600.0
    return out

