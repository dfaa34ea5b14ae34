"""Reservations whose time is up end; those about to end are warned once."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from portal.reservations import actors, services
from portal.reservations.models import Reservation
from portal.reservations.states import HOLDS_GPU, State
from scheduler.backends import Backend

from .pods import delete_quietly

# Reservations are warned this long before their end (or a tenth of their length, if shorter).
WARN_BEFORE = timedelta(minutes=10)


def expire_due(backend: Backend) -> tuple[int, int]:
    """End reservations whose time is up; warn those about to end. Returns (expired, warned)."""
    now = timezone.now()
    expired = 0
    for pk, expires_at, namespace, name in Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__lte=now) \
            .values_list("pk", "expires_at", "pod_namespace", "pod_name"):
        why = f"reached its end time {expires_at:%Y-%m-%d %H:%M} UTC"
        if services.release(pk, State.EXPIRED, why, actors.LIFECYCLE):
            expired += 1
            delete_quietly(backend, namespace, name, "reservation expired")
    warned = 0
    for pk, expires_at, placed_at in Reservation.objects.filter(
            state__in=HOLDS_GPU, expires_at__gt=now, expiry_warned_at__isnull=True, placed_at__isnull=False) \
            .values_list("pk", "expires_at", "placed_at"):
        if expires_at - now <= min(WARN_BEFORE, (expires_at - placed_at) / 10):
            warned += services.warn_expiry(pk, now)
    return expired, warned
