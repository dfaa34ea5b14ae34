"""The events nothing announces, found by looking (Celery beat, every minute): reservations that have
waited longer than their owner's limit, and those that end within 15 minutes."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import F, Max, Q
from django.utils import timezone

from portal.reservations.models import Reservation
from portal.reservations.states import HOLDS_GPU, State

from . import preferences
from .models import Event, Notification
from .services import Occurrence, notify
from .subscribers import RESERVATION_COLUMNS, model_named, models_of

EXPIRING_WITHIN = timedelta(minutes=15)


def _new(found: list[Occurrence]) -> list[Occurrence]:
    """Drop what was notified already, before composing texts for it."""
    known = set(Notification.objects.filter(key__in=[o.key for o in found]).values_list("key", flat=True))
    return [o for o in found if o.key not in known]


def waiting_long(now: datetime) -> int:
    """Pending reservations waiting longer than their owner's limit (since they last entered the
    queue: submitted or requeued), once per time in the queue."""
    shortest = timedelta(minutes=preferences.WAITING_AFTER_RANGE[0])
    rows = list(Reservation.objects.filter(state=State.PENDING)
                .annotate(waiting_since=Max("transitions__at", filter=Q(transitions__to_state=State.PENDING)))
                .filter(waiting_since__lte=now - shortest).only(*RESERVATION_COLUMNS[:-1]))
    prefs = preferences.of({r.owner_id for r in rows})
    found = []
    for r in rows:
        minutes = prefs[r.owner_id].waiting_after_min
        if r.waiting_since <= now - timedelta(minutes=minutes):
            found.append(Occurrence(f"r{r.pk}:waiting:{r.attempt}", Event.WAITING, r, model_named(r, {}), "",
                                    minutes=minutes))
    return len(notify(_new(found)))


def expiring_soon(now: datetime) -> int:
    """Reservations that end within 15 minutes and were placed for longer than that, once per end
    time (an extension moves the end: a new warning when the new end comes near)."""
    rows = list(Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__gt=now,
                                           expires_at__lte=now + EXPIRING_WITHIN,
                                           placed_at__lte=F("expires_at") - EXPIRING_WITHIN)
                .select_related("node").only(*RESERVATION_COLUMNS))
    held = models_of([r.pk for r in rows])
    found = [Occurrence(f"r{r.pk}:expiring:{int(r.expires_at.timestamp())}", Event.EXPIRING, r,
                        model_named(r, held), r.node.name if r.node_id else "") for r in rows]
    return len(notify(_new(found)))


def run_checks(now: datetime | None = None) -> tuple[int, int]:
    now = now or timezone.now()
    return waiting_long(now), expiring_soon(now)
