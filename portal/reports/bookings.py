"""Bookings in the reports, per team over a report's window, in GPU-hours (a share of 0.5 for 2
hours is 1 GPU-hour):

- booked: the windows booked (one cancelled before it started counts nothing), clipped to the
  report's window;
- held: the part of those windows its reservation held the share (placed until it ended: an early
  end frees the rest);
- used: what its processes really used of the GPU within the window, from telemetry (the share
  minutes' mean use, `reports.sources.share_sums`): 0.5 held for 2 hours and used at 30% is 0.3;
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

from . import sources
from .window import Window

RULE = ("GPU-hours of booked windows (cancelled before their start: none), of those windows the "
        "reservation held its share, of the GPU its processes really used then (telemetry), and of windows "
        "released as no-shows")


def _hours(start: datetime, end: datetime, window: Window) -> float:
    lo, hi = max(start, window.since), min(end, window.until)
    return max(0.0, (hi - lo).total_seconds() / 3600.0)


def per_team(window: Window, teams: list[Team]) -> list[dict]:
    """One entry per team: {team, booked_gpu_hours, held_gpu_hours, used_gpu_hours, no_show_gpu_hours}."""
    now = timezone.now()
    sums = {t.pk: [0.0, 0.0, 0.0, 0.0] for t in teams}  # booked, held, used, no-show
    rows = list(Reservation.objects.filter(team__in=teams, starts_at__isnull=False, starts_at__lt=window.until,
                                           ends_at__gt=window.since)
                .exclude(Q(state=State.CANCELLED) & Q(placed_at__isnull=True))
                .order_by().values_list("pk", "team_id", "starts_at", "ends_at", "placed_at", "finished_at",
                                        "gpu_request", "gpu_count", "state_reason", "state"))
    for _, team, start, end, placed, finished, share, count, reason, state in rows:
        gpus = float(share) * count
        sums[team][0] += gpus * _hours(start, end, window)
        if placed is not None:
            sums[team][1] += gpus * _hours(max(placed, start), min(finished or now, end), window)
        if state == State.EXPIRED and reason.startswith(NO_SHOW):
            sums[team][3] += gpus * _hours(start, end, window)
    for team, minutes in _used_minutes(window, rows).items():
        sums[team][2] += minutes / 60.0
    keys = ("booked_gpu_hours", "held_gpu_hours", "used_gpu_hours", "no_show_gpu_hours")
    return [{"team": t.slug, **{k: round(v, 3) for k, v in zip(keys, sums[t.pk], strict=True)}} for t in teams]


def _used_minutes(window: Window, rows: list[tuple]) -> dict[int, float]:
    """team id → GPU-minutes the placed bookings' processes used within their windows and the
    report's (a booking's reservation holds its share only inside its window: its telemetry is)."""
    placed = [r for r in rows if r[4] is not None]
    if not placed:
        return {}
    since = max(window.since, min(r[2] for r in placed))
    until = min(window.until, max(r[3] for r in placed), timezone.now())
    if until <= since:
        return {}
    team_of = {r[0]: r[1] for r in placed}
    used: dict[int, float] = {}
    for (pk,), m in sources.share_sums(since, until, sorted(set(team_of.values())), ("reservation_id",)).items():
        if pk in team_of:
            used[team_of[pk]] = used.get(team_of[pk], 0.0) + m["used"]
    return used


def totals(entries: list[dict]) -> dict:
    keys = ("booked_gpu_hours", "held_gpu_hours", "used_gpu_hours", "no_show_gpu_hours")
    return {k: round(sum(e[k] for e in entries), 3) for k in keys}
