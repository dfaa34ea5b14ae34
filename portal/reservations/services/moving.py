"""Moves along the state machine: the checked `transition`, the compare-and-set `move` that events
use (they repeat, arrive late, race with a cancel), and the moves named for why they happen:
cancel, release, preempt, and the requeue-or-fail of a reservation whose node was lost."""

from __future__ import annotations

from collections.abc import Collection

from django.db import transaction
from django.utils import timezone

from portal.cycle_requests import request_cycle
from portal.reservations import actors
from portal.reservations.events import (
    announce_allocations,
    announce_node_lost,
    announce_reservations,
    request_pod_cleanup,
)
from portal.reservations.models import Allocation, Reservation, Source
from portal.reservations.states import HOLDS_GPU, TERMINAL, IllegalTransition, State, check_transition

from .audit import record


def move(reservation_id: int, expected: str | Collection[str], target: str, why: str, actor=actors.LIFECYCLE) -> bool:
    """Compare-and-set: move to `target` only if the reservation is in `expected` (a state, or
    any of several) now, under its row lock. Returns whether it moved; a reservation in another
    state, or gone, is left alone (an event that came late or twice changes nothing)."""
    allowed = {expected} if isinstance(expected, str) else set(expected)
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().filter(pk=reservation_id).first()
        if reservation is None or reservation.state not in allowed:
            return False
        try:
            _apply(reservation, target, actor, why)
        except IllegalTransition:
            return False
    return True


def cancel(reservation_id: int, actor, reason: str = "cancelled by user") -> tuple[Reservation, bool]:
    """Cancel; returns (reservation, changed). Cancelling a cancelled one is a no-op; a finished
    one raises IllegalTransition."""
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().get(pk=reservation_id)
        if reservation.state == State.CANCELLED:
            return reservation, False
        _apply(reservation, State.CANCELLED, actor, reason)
    return reservation, True


def release(reservation_id: int, outcome: str, why: str, actor=actors.LIFECYCLE) -> bool:
    """A reservation that holds GPUs (placed or running) ends with `outcome` (succeeded, failed,
    expired, …) and gives its shares back. False when it held none any more."""
    if outcome in HOLDS_GPU:
        raise ValueError(f"releasing ends the hold: {outcome} holds GPUs")
    return move(reservation_id, HOLDS_GPU, outcome, why, actor)


def preempt(reservation_id: int, why: str, actor=actors.LIFECYCLE) -> bool:
    """Take a reservation's GPUs for a higher priority one; requeue it when its owner asked for
    that (only portal ones: a preempted kubectl pod is deleted with its request)."""
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().filter(pk=reservation_id).first()
        if reservation is None or reservation.state not in HOLDS_GPU:
            return False
        _apply(reservation, State.PREEMPTED, actor, why)
        if reservation.requeue_on_preempt and reservation.source == Source.PORTAL:
            _apply(reservation, State.PENDING, actor, f"requeued after being {why}")
    return True


def lose(reservation_id: int, why: str, actor=actors.LIFECYCLE) -> bool:
    """The node under a reservation is gone: requeue it (team policy, portal reservations only:
    a kubectl pod is bound to the lost node) or fail it. Returns whether it moved."""
    with transaction.atomic():
        reservation = (Reservation.objects.select_for_update(of=("self",)).select_related("team")
                       .filter(pk=reservation_id).first())
        if reservation is None or reservation.state not in HOLDS_GPU:
            return False
        announce_node_lost(reservation.pk, why)
        if not (reservation.team.requeue_on_node_lost and reservation.source == Source.PORTAL):
            _apply(reservation, State.FAILED, actor, why)
        elif reservation.state == State.PLACED:
            _apply(reservation, State.PENDING, actor, f"requeued: {why}")
        else:
            # running → pending is not a legal step: the run ends, and the request goes back in.
            _apply(reservation, State.PREEMPTED, actor, why)
            _apply(reservation, State.PENDING, actor, f"requeued: {why}")
    return True


def _apply(reservation: Reservation, target: str, actor, reason: str) -> None:
    current = reservation.state
    check_transition(current, target)
    node_id = reservation.node_id
    now = timezone.now()
    reservation.state = target
    reservation.state_reason = reason[:500]
    fields = ["state", "state_reason", "updated_at"]
    if target == State.RUNNING:
        reservation.started_at = now
        fields.append("started_at")
    if target in TERMINAL:
        reservation.finished_at = now
        fields.append("finished_at")
    if target == State.PENDING:
        reservation.node = None
        reservation.placed_at = None
        reservation.expires_at = None
        fields += ["node", "placed_at", "expires_at"]
    reservation.save(update_fields=fields)
    if current in HOLDS_GPU and target not in HOLDS_GPU:
        released = Allocation.objects.filter(reservation=reservation, released_at__isnull=True).update(
            released_at=now)
        if released:
            announce_allocations(node_id)
    if reservation.pod_name and (current in HOLDS_GPU or target in TERMINAL) and target not in HOLDS_GPU:
        request_pod_cleanup(reservation.pk)  # the cluster frees what the database just freed
    record(reservation, current, target, actor, reason)
    announce_reservations({reservation.pk: reservation.team_id})
    if current in HOLDS_GPU or target == State.PENDING:
        request_cycle(f"{reservation.pk} {current}→{target}", freed=current in HOLDS_GPU and target not in HOLDS_GPU)
