"""Give an active reservation more time, within its team's maximum duration."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction

from portal.reservations.events import announce_reservations
from portal.reservations.models import Reservation
from portal.reservations.states import HOLDS_GPU, State
from portal.tenancy.policy import policy_of

from .audit import record


class ExtendRefused(Exception):
    """An extension the reservation or its team's policy does not allow; the message says why."""


def extend(reservation_id: int, actor, seconds: int) -> Reservation:
    """Give an active reservation `seconds` more before it expires, within the team's maximum
    duration (portal.tenancy.policy; site admins are not held to it). Audited as a transition to
    the same state. Raises ExtendRefused, writing nothing."""
    if seconds < 60:
        raise ExtendRefused("extend by at least one minute")
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().select_related("team").get(pk=reservation_id)
        if reservation.state not in (State.PENDING, *HOLDS_GPU):
            raise ExtendRefused(f"reservation {reservation.pk} is {reservation.state}; only a pending, placed "
                                "or running one can be extended")
        if reservation.state in HOLDS_GPU:
            if reservation.expires_at is None or reservation.placed_at is None:
                raise ExtendRefused(f"reservation {reservation.pk} has no end time; there is nothing to extend")
            current = int((reservation.expires_at - reservation.placed_at).total_seconds())
        elif reservation.max_duration_s is not None:
            current = reservation.max_duration_s
        elif reservation.kind == "interactive" and reservation.team.interactive_max_s:
            current = reservation.team.interactive_max_s
        else:
            raise ExtendRefused(f"reservation {reservation.pk} has no end time; there is nothing to extend")
        longest = policy_of(reservation.team).max_duration_s
        total = current + int(seconds)
        staff = not isinstance(actor, str) and actor is not None and actor.is_staff
        if total > longest and not staff:
            left = max(0, longest - current)
            raise ExtendRefused(
                f"team {reservation.team.slug} allows reservations of at most {longest / 3600:g} h; this one "
                f"would last {total / 3600:g} h" + (f" (you can add up to {left // 60} min)" if left >= 60 else ""))
        reservation.max_duration_s = total
        fields = ["max_duration_s", "updated_at"]
        if reservation.expires_at is not None:
            reservation.expires_at += timedelta(seconds=int(seconds))
            reservation.expiry_warned_at = None
            fields += ["expires_at", "expiry_warned_at"]
        reservation.save(update_fields=fields)
        record(reservation, reservation.state, reservation.state, actor,
                f"extended by {seconds / 3600:g} h to {total / 3600:g} h")
        announce_reservations({reservation.pk: reservation.team_id})
    return reservation
