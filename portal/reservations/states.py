"""The reservation state machine: which transitions are legal. One source of truth."""

from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    # A booking: capacity promised for a future window (starts_at .. ends_at). It holds nothing and
    # waits for nothing until its start, when it becomes pending like any other request.
    BOOKED = "booked", "Booked"
    PENDING = "pending", "Pending"
    PLACED = "placed", "Placed"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    EXPIRED = "expired", "Expired"


ACTIVE = frozenset({State.PENDING, State.PLACED, State.RUNNING})
HOLDS_GPU = frozenset({State.PLACED, State.RUNNING})
TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.PREEMPTED, State.EXPIRED})

TRANSITIONS: dict[str, frozenset[str]] = {
    # booked → pending at its start (services.booking.start_due); cancelled by its owner or a team
    # admin (or moved off: deleting a booking cancels it first, for the audit).
    State.BOOKED: frozenset({State.PENDING, State.CANCELLED}),
    State.PENDING: frozenset({State.PLACED, State.CANCELLED, State.FAILED, State.EXPIRED}),
    # placed → pending: a gang rolled back or a lost node with requeue policy.
    State.PLACED: frozenset(
        {State.PENDING, State.RUNNING, State.SUCCEEDED, State.FAILED, State.CANCELLED, State.PREEMPTED,
         State.EXPIRED}
    ),
    State.RUNNING: frozenset(
        {State.SUCCEEDED, State.FAILED, State.CANCELLED, State.PREEMPTED, State.EXPIRED}
    ),
    # A preempted reservation whose owner asked for it goes back into the queue.
    State.PREEMPTED: frozenset({State.PENDING}),
    State.SUCCEEDED: frozenset(),
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
    State.EXPIRED: frozenset(),
}


class IllegalTransition(Exception):
    def __init__(self, current: str, target: str):
        super().__init__(f"cannot go from {current} to {target}")
        self.current = current
        self.target = target


def check_transition(current: str, target: str) -> None:
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(current, target)
