"""Booked windows as the placement engine sees them (`scheduler.core.bookings.Booking`).

The cycle's snapshot carries the bookings of the next `FEED_S` (their room is held ahead of the
window and placement works around them), those whose window began while their reservation waits
(it takes the room held for it first) and those whose window runs (nobody's victim to its end).
A booking is a reservation with a `starts_at`; its window ends at `ends_at` (`WINDOW_END_FIELD`),
or `max_duration_s` after its start where that is empty.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from portal.reservations.models import Reservation
from portal.reservations.states import ACTIVE, State
from scheduler.core.bookings import DEFAULT_LEAD_S, Booking

BOOKED = "booked"  # the state of a reservation whose window has not started
WINDOW_END_FIELD = "ends_at"  # the reservation's field where a booked window ends
FEED_S = 12 * 3600.0  # bookings starting this far ahead reach the engine


def window_end(starts_at: datetime, end: datetime | None, max_duration_s: int | None) -> datetime | None:
    """Where a booking's window ends: its end field, else its start plus its duration (None: neither)."""
    if end is not None:
        return end
    return starts_at + timedelta(seconds=max_duration_s) if max_duration_s else None


def lead_of(grace_s: int | None) -> float:
    """How long before its window a booking's room is held and work in its way warned: the team's
    grace, and never less than 15 minutes."""
    return max(DEFAULT_LEAD_S, float(grace_s or 0))


def bookings(now: datetime) -> tuple[Booking, ...]:
    """The bookings the cycle at `now` works around: booked windows starting within `FEED_S`, and
    started ones (waiting, placed or running) whose window has not ended."""
    rows = (Reservation.objects.filter(starts_at__isnull=False, starts_at__lte=now + timedelta(seconds=FEED_S),
                                       state__in=[BOOKED, *ACTIVE])
            .order_by("starts_at", "id")
            .values_list("pk", "team__slug", "gpu_model", "gpu_request", "gpu_memory_mib", "gpu_count", "starts_at",
                         WINDOW_END_FIELD, "max_duration_s", "state", "team__policy__reclaim_grace_s"))
    out = []
    for pk, team, model, share, memory, count, starts_at, end, max_duration_s, state, grace in rows:
        ends_at = window_end(starts_at, end, max_duration_s)
        if ends_at is None or ends_at <= now or ends_at <= starts_at or not model or "|" in model:
            continue  # no window, over, or not one GPU model: nothing to hold
        if state != BOOKED and starts_at > now:
            continue  # placed ahead of its window some other way: an ordinary reservation
        out.append(Booking(str(pk), team, model, float(share), memory, count, starts_at.timestamp(),
                           ends_at.timestamp(), lead_of(grace)))
    return tuple(out)


def held_soon(booked: tuple[Booking, ...], now: datetime) -> bool:
    """Whether a booked window's lead time has begun: the cycle must run then, even with nobody
    waiting, to hold its room and warn the work in its way."""
    t = now.timestamp()
    return any(b.held_from() <= t < b.starts_at for b in booked)


def durations(booked: tuple[Booking, ...]) -> dict[str, float]:
    """Waiting reservation → how long it runs once placed, where its end is known (its maximum
    duration): read only when there are bookings to place around."""
    if not booked:
        return {}
    rows = Reservation.objects.filter(state=State.PENDING, max_duration_s__isnull=False).order_by()
    return {str(pk): float(s) for pk, s in rows.values_list("pk", "max_duration_s")}
