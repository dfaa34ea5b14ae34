"""Where each waiting reservation stands: its place in the queue and a rough start estimate."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from django.utils import timezone

from portal.precompiled import Precompiled
from portal.reservations import services
from portal.reservations.models import Reservation
from portal.reservations.states import HOLDS_GPU, State


class Queued(NamedTuple):
    """What a cycle reads of the whole queue (briefly: it may hold thousands)."""

    pk: int
    priority: int
    created_at: datetime
    position: int | None
    estimated_start: datetime | None
    group: str


# Every cycle runs these: compiled once (portal.precompiled).
_QUEUE = Precompiled(lambda: Reservation.objects.filter(state=State.PENDING).order_by("created_at", "id")
                     .values_list("pk", "priority", "created_at", "queue_position", "estimated_start", "group_name"))
_WAITING = Precompiled(lambda: Reservation.objects.filter(state=State.PENDING).order_by().values_list("pk", flat=True))
_KNOWN_ENDS = Precompiled(lambda: Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__isnull=False)
                          .order_by().values_list("expires_at", flat=True))


def read_queue() -> list[Queued]:
    return [Queued._make(row) for row in _QUEUE.all()]


def update_queue(queue: list[Queued]) -> None:
    """Queue position (priority, then age) and a rough estimated start for what still waits: the
    k-th waiting reservation may start when the k-th known end time among running ones comes."""
    still = set(_WAITING.all())
    order = sorted((q for q in queue if q.pk in still), key=lambda q: (-q.priority, q.created_at, q.pk))
    ends = sorted(_KNOWN_ENDS.all()) if order else []  # nothing waits (the usual case): no estimate to make
    now = timezone.now()
    changed = []
    for position, q in enumerate(order, start=1):
        estimate = max(ends[position - 1], now) if position <= len(ends) else None
        if q.position != position or q.estimated_start != estimate:
            changed.append((q.pk, position, estimate))
    services.set_queue_positions(changed)
