"""What happened to reservations, heard from the reservation services' own after-commit signals:
`reservations_changed` (every change of state, reason, reclaim or idle mark) and `node_lost`. The
reservation services stay the only writer of reservations; this only reads them and notifies.

Each event is read off the reservation as it is now, with a key that names its occurrence (the
attempt for running, reclaim and node lost; the moment for idle), so hearing a change twice, or a
later change of the same reservation, tells nobody again."""

from __future__ import annotations

import logging

from django.db.models import Q
from django.dispatch import receiver

from portal.reservations.events import booking_drained, node_lost, reservations_changed
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import HOLDS_GPU, State

from .models import Event, Notification
from .services import Occurrence, notify

log = logging.getLogger(__name__)

RESERVATION_COLUMNS = ("id", "owner_id", "team_id", "name", "state", "state_reason", "attempt", "gpu_request",
                       "gpu_count", "gpu_model", "reclaim_at", "idle_since", "expires_at", "node__name")


def models_of(reservation_ids) -> dict[int, str]:
    """The GPU model each reservation holds or last held (what its text names)."""
    out: dict[int, str] = {}
    for rid, model in (Allocation.objects.filter(reservation_id__in=reservation_ids)
                       .order_by("reservation_id", "-created_at").values_list("reservation_id", "gpu__model")):
        out.setdefault(rid, model)
    return out


def model_named(r: Reservation, held: dict[int, str]) -> str:
    return held.get(r.pk) or (r.gpu_model.split("|")[0] if r.gpu_model else "")


def occurrences_of(rows: list[Reservation]) -> list[Occurrence]:
    """The events these reservations are at now."""
    held = models_of([r.pk for r in rows])
    lost = set(Notification.objects.filter(
        key__in=[f"r{r.pk}:node_lost:{r.attempt}" for r in rows if r.state == State.FAILED])
        .values_list("key", flat=True))
    found = []
    for r in rows:
        node = r.node.name if r.node_id else ""
        base = {"reservation": r, "model": model_named(r, held), "node": node}
        if r.state == State.RUNNING:
            found.append(Occurrence(f"r{r.pk}:running:{r.attempt}", Event.RUNNING, **base))
        if r.state == State.SUCCEEDED:
            found.append(Occurrence(f"r{r.pk}:finished", Event.FINISHED, **base))
        if r.state == State.FAILED and f"r{r.pk}:node_lost:{r.attempt}" not in lost:
            found.append(Occurrence(f"r{r.pk}:failed", Event.FAILED, why=r.state_reason, **base))
        if r.state in HOLDS_GPU and r.reclaim_at is not None:
            found.append(Occurrence(f"r{r.pk}:reclaim:{r.attempt}", Event.RECLAIM, why=r.state_reason, **base))
        if r.state == State.RUNNING and r.idle_since is not None:
            found.append(Occurrence(f"r{r.pk}:idle:{int(r.idle_since.timestamp())}", Event.IDLE, **base))
    return found


@receiver(reservations_changed, dispatch_uid="notifications.reservations_changed")
def on_reservations_changed(sender, changes: dict[int, int], **kwargs) -> None:
    try:
        _notify_changes(changes)
    except Exception:  # the signal's other receivers (the live pages) still hear of the change
        log.exception("could not notify the changes of reservations %s", sorted(changes)[:10])


def _notify_changes(changes: dict[int, int]) -> None:
    # Only the rows at an event are read: a placement batch or new queue places (pending rows) cost
    # one indexed query that finds nothing.
    rows = list(Reservation.objects.filter(pk__in=list(changes)).filter(
        Q(state__in=(State.RUNNING, State.SUCCEEDED, State.FAILED))
        | Q(state__in=HOLDS_GPU, reclaim_at__isnull=False)).select_related("node").only(*RESERVATION_COLUMNS))
    if rows:
        notify(occurrences_of(rows))


@receiver(node_lost, dispatch_uid="notifications.node_lost")
def on_node_lost(sender, reservation_id: int, why: str, **kwargs) -> None:
    try:
        _notify_node_lost(reservation_id, why)
    except Exception:
        log.exception("could not notify that reservation %s lost its node", reservation_id)


def _notify_node_lost(reservation_id: int, why: str) -> None:
    r = Reservation.objects.filter(pk=reservation_id).select_related("node").only(*RESERVATION_COLUMNS).first()
    if r is None:
        return
    held = models_of([r.pk])
    node = held_node = r.node.name if r.node_id else ""
    if not held_node:  # requeued: the node it lost is the one its last allocation was on
        node = (Allocation.objects.filter(reservation_id=r.pk).order_by("-created_at")
                .values_list("gpu__node__name", flat=True).first() or "")
    # The attempt it lost (a requeued one is placed again with attempt + 1, which is a new run).
    notify([Occurrence(f"r{r.pk}:node_lost:{r.attempt}", Event.NODE_LOST, r, model_named(r, held), node, why)])


@receiver(booking_drained, dispatch_uid="notifications.booking_drained")
def on_booking_drained(sender, reservation_ids: list[int], plan_id: int, why: str, **kwargs) -> None:
    """A forced planned drain over bookings: each owner is told once per plan."""
    try:
        rows = list(Reservation.objects.filter(pk__in=reservation_ids).select_related("node")
                    .only(*RESERVATION_COLUMNS, "starts_at", "ends_at"))
        notify([Occurrence(f"r{r.pk}:drain:{plan_id}", Event.DRAIN, r, model=model_named(r, {}), why=why)
                for r in rows])
    except Exception:
        log.exception("could not tell the owners of bookings %s of planned drain %s", reservation_ids[:10], plan_id)
