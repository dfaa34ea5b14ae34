"""Commit the placement engine's decisions: lock, re-check capacity, write the allocations and
the placed reservations (attempt, pod name, end time) and their audit rows in bulk."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from portal.bulk import insert_rows, update_rows
from portal.fleet.models import Gpu, Node, NodeStatus, gpus_name
from portal.precompiled import Precompiled, param_in
from portal.reservations import actors
from portal.reservations.events import announce_allocations, announce_reservations
from portal.reservations.models import Allocation, Kind, Reservation, Source, StateTransition
from portal.reservations.states import IllegalTransition, State, check_transition
from scheduler.backends import pod_name

from .audit import actor_label, actor_user_id


class CapacityConflict(Exception):
    """A placement no longer fits: another decision took the capacity first."""


@dataclass(frozen=True)
class NewAllocation:
    """One GPU of a placement: the share of it (and memory) the reservation will hold."""

    gpu_id: int
    gpu_request: Decimal
    gpu_memory_mib: int


@dataclass(frozen=True)
class Placing:
    """Place reservation `reservation_id` on node `node_id` with these allocations (database ids;
    the engine's `scheduler.core.Placement` names the same choice by node name and GPU uuid)."""

    reservation_id: int
    node_id: int
    allocations: tuple[NewAllocation, ...]
    reason: str = "placed"
    # How the GPU is shared (Reservation.sharing) and why; a remote share's pod runs on
    # `client_node_id` and its GPU is on `node_id` (scheduler.core.remote).
    sharing: str = ""
    sharing_reason: str = ""
    client_node_id: int | None = None
    # How it counts against quotas (Reservation.admission), as the cycle decided.
    admission: str = "guaranteed"


# Only the fields placing reads and writes: a batch locks hundreds of rows; others load on access.
PLACING_FIELDS = ("state", "gpu_limit", "gpu_count", "max_duration_s", "ends_at", "kind", "source", "attempt",
                  "team__interactive_max_s")


# Every commit runs these with its own ids: compiled once (portal.precompiled). Both locks are
# taken in id order, so concurrent commits cannot deadlock.
_LOCK_RESERVATIONS = Precompiled(lambda: Reservation.objects.select_for_update(of=("self",)).select_related("team")
                                 .only(*PLACING_FIELDS).filter(param_in("pk", "ids")).order_by("pk"))
_NODES = Precompiled(lambda: Node.objects.filter(param_in("pk", "ids")).order_by().only("name", "status"))
_LOCK_GPUS = Precompiled(lambda: Gpu.objects.select_for_update().filter(param_in("pk", "ids")).order_by("pk")
                         .only("node_id", "uuid", "index", "model", "memory_mib"))
_TAKEN = Precompiled(lambda: Allocation.objects.filter(param_in("gpu_id", "ids"), released_at__isnull=True)
                     .values("gpu_id").annotate(share=Sum("gpu_request"), memory=Sum("gpu_memory_mib"))
                     .order_by().values_list("gpu_id", "share", "memory"))


def ends_at(reservation: Reservation, placed_at: datetime) -> datetime | None:
    """When a reservation placed at `placed_at` ends: its own duration, else the team's limit for
    interactive ones; a batch job without a duration runs until it finishes; a booking ends with
    its window, however late it was placed. The one place the end time is computed."""
    if reservation.ends_at is not None:
        return reservation.ends_at
    seconds = reservation.max_duration_s
    if seconds is None and reservation.kind == Kind.INTERACTIVE:
        seconds = reservation.team.interactive_max_s or None
    return placed_at + timedelta(seconds=seconds) if seconds else None


def place(reservation_id: int, node_id: int, allocations: Iterable[NewAllocation], actor=actors.SCHEDULER,
          reason: str = "placed", admission: str = "guaranteed") -> Reservation:
    """Commit one placement. Raises CapacityConflict (or IllegalTransition) when it no longer
    fits, leaving nothing written."""
    placed, refused = place_many([[Placing(reservation_id, node_id, tuple(allocations), reason,
                                           admission=admission)]], actor)
    if refused:
        raise refused[reservation_id]
    return placed[0]


def place_many(units: Sequence[Sequence[Placing]], actor=actors.SCHEDULER
               ) -> tuple[list[Reservation], dict[int, Exception]]:
    """Commit many placements in one transaction with a constant number of queries: lock the
    reservations and then the GPU rows (both in id order, so concurrent callers cannot deadlock),
    re-check every GPU's free capacity against the live allocations, and write the allocations,
    the reservations and their audit rows in bulk.

    A unit (one reservation, or the members of a gang) is placed whole or not at all; one that
    no longer fits is left untouched and reported as {reservation id: CapacityConflict or
    IllegalTransition} for each of its members. Returns (placed reservations, refused)."""
    placings = [p for unit in units for p in unit]
    if not placings:
        return [], {}
    refused: dict[int, Exception] = {}
    with transaction.atomic():
        reservations = {r.pk: r for r in _LOCK_RESERVATIONS.all(ids=sorted({p.reservation_id for p in placings}))}
        node_ids = {p.node_id for p in placings} | {p.client_node_id for p in placings if p.client_node_id}
        nodes = {n.pk: n for n in _NODES.all(ids=sorted(node_ids))}
        gpu_ids = sorted({a.gpu_id for p in placings for a in p.allocations})
        gpus = {g.pk: g for g in _LOCK_GPUS.all(ids=gpu_ids)}
        taken = {gpu_id: [share, memory] for gpu_id, share, memory in _TAKEN.all(ids=gpu_ids)}
        accepted: list[Placing] = []
        claimed: set[int] = set()
        for unit in units:
            try:
                adds = _check_unit(unit, reservations, nodes, gpus, taken, claimed)
            except (CapacityConflict, IllegalTransition, Reservation.DoesNotExist) as exc:
                refused.update((p.reservation_id, exc) for p in unit)
                continue
            for gpu_id, (share, memory) in adds.items():
                used = taken.setdefault(gpu_id, [Decimal(0), 0])
                used[0] += share
                used[1] += memory
            claimed.update(p.reservation_id for p in unit)
            accepted.extend(unit)
        if accepted:
            _write(accepted, reservations, actor)
    return [reservations[p.reservation_id] for p in accepted], refused


def _check_unit(unit: Sequence[Placing], reservations: dict[int, Reservation], nodes: dict[int, Node],
                gpus: dict[int, Gpu], taken: dict[int, list], claimed: set[int]) -> dict[int, tuple[Decimal, int]]:
    """What the unit adds to each GPU, if all of it still fits; raises otherwise."""
    adds: dict[int, tuple[Decimal, int]] = {}
    for p in unit:
        reservation = reservations.get(p.reservation_id)
        if reservation is None:
            raise Reservation.DoesNotExist(f"reservation {p.reservation_id} does not exist")
        if p.reservation_id in claimed:  # placed by an earlier unit of this commit
            raise IllegalTransition(State.PLACED, State.PLACED)
        check_transition(reservation.state, State.PLACED)
        node = nodes.get(p.node_id)
        if node is None or node.status != NodeStatus.READY:
            raise CapacityConflict(f"node {node.name if node else p.node_id} is "
                                   f"{node.status if node else 'gone'}")
        if p.client_node_id is not None:  # a remote share: its pod's node must take pods too
            client = nodes.get(p.client_node_id)
            if client is None or client.status != NodeStatus.READY:
                raise CapacityConflict(f"node {client.name if client else p.client_node_id} is "
                                       f"{client.status if client else 'gone'}")
        if not p.allocations:
            raise CapacityConflict(f"reservation {p.reservation_id}: a placement needs at least one GPU")
        for a in p.allocations:
            gpu = gpus.get(a.gpu_id)
            if gpu is None or gpu.node_id != node.pk:
                raise CapacityConflict(f"GPU {a.gpu_id} is not on node {node.name}")
            share, memory = adds.get(a.gpu_id, (Decimal(0), 0))
            share, memory = share + a.gpu_request, memory + a.gpu_memory_mib
            used_share, used_memory = taken.get(a.gpu_id, (Decimal(0), 0))
            if used_share + share > 1 or used_memory + memory > gpu.memory_mib:
                raise CapacityConflict(f"{gpus_name([gpu.index], node.name, gpu.model)} no longer has room for "
                                       "this share")
            adds[a.gpu_id] = (share, memory)
    return adds


def _write(accepted: list[Placing], reservations: dict[int, Reservation], actor) -> None:
    now = timezone.now()
    rows = [reservations[p.reservation_id] for p in accepted]
    (from_state,) = {r.state for r in rows}  # check_transition let only `pending` through
    namespace = settings.TESSERA_NAMESPACE
    for p, r in zip(accepted, rows, strict=True):
        r.node_id = p.node_id
        r.attempt += 1
        r.expires_at = ends_at(r, now)
        r.state_reason = p.reason[:500]
        r.sharing, r.sharing_reason, r.client_node_id = p.sharing, p.sharing_reason[:300], p.client_node_id
        r.admission = p.admission
        # The pod that runs it: ours are named for the attempt; a kubectl one is the user's pod.
        if r.source == Source.PORTAL:
            r.pod_namespace, r.pod_name = namespace, pod_name(r.pk, r.attempt)
    # Written as plain rows, not through bulk_create/bulk_update: see portal.bulk for the cost.
    insert_rows(Allocation, ["reservation", "gpu", "gpu_request", "gpu_limit", "gpu_memory_mib"], [
        (r.pk, a.gpu_id, a.gpu_request, r.gpu_limit if r.gpu_count == 1 else a.gpu_request, a.gpu_memory_mib)
        for p, r in zip(accepted, rows, strict=True) for a in sorted(p.allocations, key=lambda a: a.gpu_id)
    ], same={"created_at": now, "released_at": None})
    same = {"state": State.PLACED, "placed_at": now, "updated_at": now, "queue_position": None,
            "estimated_start": None, "idle_since": None, "expiry_warned_at": None, "reclaim_at": None}
    portal = [r for r in rows if r.source == Source.PORTAL]
    kubectl = [r for r in rows if r.source != Source.PORTAL]
    varying = ["node", "attempt", "expires_at", "state_reason", "sharing", "sharing_reason", "client_node",
               "admission"]
    update_rows(portal, [*varying, "pod_name"], same | {"pod_namespace": namespace, "pod_uid": ""})
    update_rows(kubectl, varying, same)
    for r in rows:
        r.state, r.placed_at, r.updated_at = State.PLACED, now, now
    insert_rows(StateTransition, ["reservation", "reason"], [(r.pk, r.state_reason) for r in rows], same={
        "from_state": from_state, "to_state": State.PLACED, "actor": actor_user_id(actor),
        "actor_label": actor_label(actor), "at": now})
    for node_id in sorted({p.node_id for p in accepted}):
        announce_allocations(node_id)
    announce_reservations({r.pk: r.team_id for r in rows})
