"""Bookings and planned drains over time: drain the nodes whose planned drain starts and return
those whose drain ends (fleet.services.apply_due_drains, first, so a booking starting in the same
tick is not placed on a node about to drain), start the bookings whose window has come (booked →
pending, so the next cycle places them), and release a started booking whose owner did not show
up: no process on its GPU for the first `booking_no_show_min` minutes of its team's policy (the
owner hears of it through the transition's reason, its audit row and the team's live push, as for
any other transition)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from portal.fleet import services as fleet_services
from portal.reservations import services
from portal.reservations.models import Reservation
from portal.reservations.states import HOLDS_GPU
from portal.tenancy.policy import policy_of

# A booking is judged for a no-show in the half hour after its first N minutes (N ≤ a day); later
# idleness is idle reclaim's business (idle.py).
JUDGED_FOR = timedelta(minutes=30)
Seen = Callable[[dict[int, tuple[datetime, datetime]]], dict[int, bool]]


def processes_seen(windows: dict[int, tuple[datetime, datetime]]) -> dict[int, bool]:
    """reservation id → whether any process used its GPU (compute or memory) between the two
    times; absent: no reading at all (no agent reports it), which is not a no-show."""
    from portal.telemetry.models import ShareMinute, ShareSample

    out: dict[int, bool] = {}
    for pk, (start, end) in windows.items():
        raw = ShareSample.objects.filter(reservation_id=pk, ts__gte=start, ts__lt=end)
        minutes = ShareMinute.objects.filter(reservation_id=pk, minute__gte=start, minute__lt=end)
        if not (raw.exists() or minutes.exists()):
            continue
        out[pk] = (raw.filter(Q(used_frac__gt=0) | Q(mem_used_mib__gt=0)).exists()
                   or minutes.filter(Q(used_max__gt=0) | Q(mem_used_max__gt=0)).exists())
    return out


def check_no_shows(seen: Seen = processes_seen, now: datetime | None = None) -> int:
    """Release the started bookings nobody used in their first minutes. Returns how many."""
    now = now or timezone.now()
    started = (Reservation.objects.filter(state__in=HOLDS_GPU, starts_at__isnull=False, placed_at__isnull=False,
                                          placed_at__gt=now - timedelta(days=2))
               .select_related("team", "team__policy").order_by("pk"))
    windows: dict[int, tuple[datetime, datetime]] = {}
    minutes: dict[int, int] = {}
    for r in started:
        n = policy_of(r.team).booking_no_show_min
        first = timedelta(minutes=n)
        if r.placed_at + first <= now < r.placed_at + first + JUDGED_FOR:
            windows[r.pk] = (r.placed_at, r.placed_at + first)
            minutes[r.pk] = n
    released = 0
    for pk, used in seen(windows).items():
        if not used:
            released += services.release_no_show(pk, minutes[pk])
    return released


def tick(seen: Seen = processes_seen) -> dict:
    drained, returned = fleet_services.apply_due_drains()
    started, missed = services.start_due()
    return {"drains_started": drained, "drains_ended": returned, "started": started, "missed": missed,
            "no_shows": check_no_shows(seen)}
