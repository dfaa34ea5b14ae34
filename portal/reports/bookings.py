"""Bookings in the reports, per team over a report's window, in GPU-hours (a share of 0.5 for 2
hours is 1 GPU-hour):

- booked: the windows booked (one cancelled before it started counts nothing), clipped to the
  report's window;
- used: the part of those windows its reservation held the share (placed until it ended: an early
  end frees the rest);
- no-show: the booked windows of reservations released because nobody used them
  (placement/bookings.py), clipped to the report's window.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from portal.reservations.models import Reservation
from portal.reservations.services.booking import NO_SHOW
from portal.reservations.states import State
from portal.tenancy.models import Team

from .window import Window

RULE = ("GPU-hours of booked windows (cancelled before their start: none), of those windows the "
        "reservation held its share, and of windows released as no-shows")


def _hours(start: datetime, end: datetime, window: Window) -> float:
    lo, hi = max(start, window.since), min(end, window.until)
    return max(0.0, (hi - lo).total_seconds() / 3600.0)


def per_team(window: Window, teams: list[Team]) -> list[dict]:
    """One entry per team: {team, booked_gpu_hours, used_gpu_hours, no_show_gpu_hours}."""
    now = timezone.now()
    sums = {t.pk: [0.0, 0.0, 0.0] for t in teams}
    rows = (Reservation.objects.filter(team__in=teams, starts_at__isnull=False, starts_at__lt=window.until,
                                       ends_at__gt=window.since)
            .exclude(Q(state=State.CANCELLED) & Q(placed_at__isnull=True))
            .order_by().values_list("team_id", "starts_at", "ends_at", "placed_at", "finished_at", "gpu_request",
                                    "gpu_count", "state_reason", "state"))
    for team, start, end, placed, finished, share, count, reason, state in rows:
        gpus = float(share) * count
        sums[team][0] += gpus * _hours(start, end, window)
        if placed is not None:
            sums[team][1] += gpus * _hours(max(placed, start), min(finished or now, end), window)
        if state == State.EXPIRED and reason.startswith(NO_SHOW):
            sums[team][2] += gpus * _hours(start, end, window)
    return [{"team": t.slug, "booked_gpu_hours": round(sums[t.pk][0], 3), "used_gpu_hours": round(sums[t.pk][1], 3),
             "no_show_gpu_hours": round(sums[t.pk][2], 3)} for t in teams]


def totals(entries: list[dict]) -> dict:
    keys = ("booked_gpu_hours", "used_gpu_hours", "no_show_gpu_hours")
    return {k: round(sum(e[k] for e in entries), 3) for k in keys}
