"""Reclaim: a borrowed reservation whose capacity its lender wants back (within the lender's quota),
or work in the way of a booked window (`FOR_A_BOOKING`), is warned first and preempted when its
team's grace is over (`reclaim_at`). The warning is a note on the running reservation (its page,
the live push and an audit row say when it goes); the pod gets SIGTERM with that grace from the
binding task; the preemption itself is the placement cycle's (`preempt`, when the time has come)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from django.db import transaction

from portal.reservations import actors
from portal.reservations.events import announce_reservations
from portal.reservations.models import Admission, Reservation
from portal.reservations.states import HOLDS_GPU

from .audit import record

# What a booked window ahead may warn (bookings.plan): borrowed and opportunistic work in its way,
# and guaranteed work only where the room exists in total but not in the booking's shape.
FOR_A_BOOKING = (Admission.BORROWED, Admission.OPPORTUNISTIC, Admission.GUARANTEED)


def warn_reclaim(reservation_id: int, at: datetime, why: str, actor=actors.SCHEDULER,
                 admissions: Collection[str] = (Admission.BORROWED,)) -> Reservation | None:
    """Mark a reservation that holds GPUs, admitted as one of `admissions` (a quota reclaim: borrowed
    only; a booking: `FOR_A_BOOKING`), to be reclaimed at `at` (compare-and-set: one already warned
    keeps its first time). Returns it when this call warned it, else None."""
    with transaction.atomic():
        r = (Reservation.objects.select_for_update().filter(
            pk=reservation_id, state__in=HOLDS_GPU, admission__in=admissions, reclaim_at__isnull=True).first())
        if r is None:
            return None
        r.reclaim_at = at
        r.state_reason = why[:500]
        r.save(update_fields=["reclaim_at", "state_reason", "updated_at"])
        record(r, r.state, r.state, actor, why)
        announce_reservations({r.pk: r.team_id})
    return r
