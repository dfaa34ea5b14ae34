"""What the audit log keeps of terminals opened in reservations' pods."""

from __future__ import annotations

from django.db import transaction

from portal.reservations.models import Reservation

from .audit import record


def note_terminal_opened(reservation_id: int, actor) -> None:
    """One audit row per terminal opened, as a transition to the same state (as an extension is)."""
    with transaction.atomic():
        reservation = Reservation.objects.get(pk=reservation_id)
        record(reservation, reservation.state, reservation.state, actor, "terminal opened")
