"""Reservation operations, called by pages, the API and placement tasks alike:
submit, cancel, transition, place, release."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from portal.fleet.models import Gpu, Node, NodeStatus
from portal.tenancy.models import Team

from . import rules
from .events import announce_allocations, request_cycle
from .models import Allocation, Reservation, StateTransition
from .quota import QuotaExceeded, over_quota, usage_of
from .states import HOLDS_GPU, TERMINAL, State, check_transition


class CapacityConflict(Exception):
    """A placement no longer fits: another decision took the capacity first."""


def _actor_label(actor) -> str:
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    return actor.get_username()


def _record(reservation: Reservation, from_state: str, to_state: str, actor, reason: str) -> None:
    StateTransition.objects.create(
        reservation=reservation,
        from_state=from_state,
        to_state=to_state,
        actor=None if actor is None or isinstance(actor, str) else actor,
        actor_label=_actor_label(actor),
        reason=reason[:500],
    )


def submit(user, spec: rules.ReservationSpec) -> Reservation:
    """Validate, admit against the team's quota under a row lock, store as pending.

    The team row lock serialises concurrent submissions of one team, so two requests that
    together exceed the quota can never both be admitted.
    """
    rules.check(spec)  # also coerces the numbers in spec
    share = spec.gpu_request * spec.gpu_count
    memory = spec.gpu_memory_mib * spec.gpu_count
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=spec.team.pk)
        usage = usage_of(team)
        problem = over_quota(team, usage, share, memory, spec.gpu_count)
        opportunistic = False
        if problem:
            if spec.priority == 0 and team.allow_over_quota:
                opportunistic = True
            else:
                if not team.allow_over_quota:
                    problem += f"; team {team.slug} does not allow over-quota use"
                else:
                    problem += "; priority-0 (opportunistic, preemptible) requests may run beyond the quota"
                raise QuotaExceeded(problem, team, usage)
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "team"}
        reservation = Reservation.objects.create(
            owner=user, team=team, opportunistic=opportunistic,
            state_reason="waiting for the next placement cycle", **fields,
        )
        why = "submitted" + (" as opportunistic (over quota)" if opportunistic else "")
        _record(reservation, "", State.PENDING, user, why)
        request_cycle("submitted")
    return reservation


def transition(reservation_id: int, target: str, actor=None, reason: str = "") -> Reservation:
    """Move a reservation to `target` if the state machine allows it; audit it; release its GPUs
    when it stops holding them. Raises IllegalTransition otherwise."""
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().get(pk=reservation_id)
        _apply(reservation, target, actor, reason)
    return reservation


def _apply(reservation: Reservation, target: str, actor, reason: str) -> None:
    current = reservation.state
    check_transition(current, target)
    node_id = reservation.node_id
    now = timezone.now()
    reservation.state = target
    reservation.state_reason = reason
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
        _release(reservation, node_id, now)
    _record(reservation, current, target, actor, reason)
    if current in HOLDS_GPU or target == State.PENDING:
        request_cycle(f"{reservation.pk} {current}→{target}")


def _release(reservation: Reservation, node_id: int | None, now) -> None:
    released = Allocation.objects.filter(reservation=reservation, released_at__isnull=True).update(released_at=now)
    if released:
        announce_allocations(node_id)


def cancel(reservation_id: int, actor, reason: str = "cancelled by user") -> tuple[Reservation, bool]:
    """Cancel; returns (reservation, changed). Cancelling a cancelled one is a no-op; a finished
    one raises IllegalTransition."""
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().get(pk=reservation_id)
        if reservation.state == State.CANCELLED:
            return reservation, False
        _apply(reservation, State.CANCELLED, actor, reason)
    return reservation, True


@dataclass(frozen=True)
class Share:
    gpu_id: int
    compute_share: Decimal
    memory_mib: int


def place(reservation_id: int, node_id: int, shares: Iterable[Share], actor="system:scheduler",
          reason: str = "placed") -> Reservation:
    """Commit one placement decision: lock the GPU rows, re-check their free capacity, create the
    allocations and move the reservation to `placed`. Raises CapacityConflict when the decision no
    longer fits, leaving nothing written."""
    shares = sorted(shares, key=lambda s: s.gpu_id)
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().get(pk=reservation_id)
        check_transition(reservation.state, State.PLACED)
        node = Node.objects.get(pk=node_id)
        if node.status != NodeStatus.READY:
            raise CapacityConflict(f"node {node.name} is {node.status}")
        # Locked in id order so that concurrent cycles cannot deadlock on each other.
        locked = Gpu.objects.select_for_update().filter(pk__in=[s.gpu_id for s in shares]).order_by("pk")
        gpus = {g.pk: g for g in locked}
        used = {
            row["gpu_id"]: row
            for row in Allocation.objects.filter(gpu_id__in=gpus, released_at__isnull=True)
            .values("gpu_id").annotate(share=Sum("compute_share"), memory=Sum("memory_mib"))
        }
        for s in shares:
            gpu = gpus.get(s.gpu_id)
            if gpu is None or gpu.node_id != node.pk:
                raise CapacityConflict(f"GPU {s.gpu_id} is not on node {node.name}")
            taken = used.get(s.gpu_id, {"share": Decimal(0), "memory": 0})
            if taken["share"] + s.compute_share > 1 or taken["memory"] + s.memory_mib > gpu.memory_mib:
                raise CapacityConflict(f"GPU {gpu.uuid} no longer has room for this share")
        Allocation.objects.bulk_create(
            Allocation(reservation=reservation, gpu_id=s.gpu_id, compute_share=s.compute_share,
                       compute_limit=reservation.gpu_limit if reservation.gpu_count == 1 else s.compute_share,
                       memory_mib=s.memory_mib)
            for s in shares
        )
        now = timezone.now()
        reservation.node = node
        reservation.placed_at = now
        if reservation.max_duration_s:
            reservation.expires_at = now + timedelta(seconds=reservation.max_duration_s)
        reservation.save(update_fields=["node", "placed_at", "expires_at"])
        _apply(reservation, State.PLACED, actor, reason)
        announce_allocations(node.pk)
    return reservation


def note_pending_reason(reservation_id: int, reason: str) -> None:
    """Store why a pending reservation is not placed yet (shown by the API as state_reason)."""
    Reservation.objects.filter(pk=reservation_id, state=State.PENDING).update(state_reason=reason[:500])
