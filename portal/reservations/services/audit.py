"""The audit log of a reservation: one row per state change (and per extension), who and why."""

from __future__ import annotations

from portal.reservations.models import Reservation, StateTransition

SYSTEM = "system"


def actor_label(actor) -> str:
    """A user's name, or the name of the system component that acted (a plain string)."""
    if actor is None:
        return SYSTEM
    if isinstance(actor, str):
        return actor
    return actor.get_username()


def actor_user_id(actor) -> int | None:
    return None if actor is None or isinstance(actor, str) else actor.pk


def record(reservation: Reservation, from_state: str, to_state: str, actor, reason: str) -> None:
    StateTransition.objects.create(
        reservation=reservation, from_state=from_state, to_state=to_state,
        actor_id=actor_user_id(actor), actor_label=actor_label(actor), reason=reason[:500],
    )
