"""Reservation operations, called by pages, the API and placement tasks alike:
submit, cancel, transition, place, release."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from portal.bulk import insert_rows, update_rows
from portal.fleet.models import Gpu, Node, NodeStatus
from portal.tenancy import policy
from portal.tenancy.models import Team

from . import rules
from .events import announce_allocations, announce_reservations, request_cycle
from .models import Allocation, Reservation, StateTransition
from .quota import QuotaExceeded, over_quota, usage_of
from .states import HOLDS_GPU, TERMINAL, IllegalTransition, State, check_transition


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


def submit(user, spec: rules.ReservationSpec, *, cluster_path: bool = False) -> Reservation:
    """Validate, admit against the team's quota under a row lock, store as pending.

    The team row lock serialises concurrent submissions of one team, so two requests that
    together exceed the quota can never both be admitted. A person's request keeps to the team's
    policy (priority ceiling of their role, longest duration); `cluster_path` is the kubectl path,
    where the cluster's own access control stands for the person.
    """
    rules.check(spec)  # also coerces the numbers in spec
    if not cluster_path:
        problems = policy.request_problems(user, spec.team, priority=spec.priority,
                                           max_duration_s=spec.max_duration_s)
        if problems:
            raise rules.RuleViolation(problems)
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
        announce_reservations({reservation.pk: team.pk})
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
    announce_reservations({reservation.pk: reservation.team_id})
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


@dataclass(frozen=True)
class Decision:
    """Place reservation `reservation_id` on node `node_id` with these GPU shares."""

    reservation_id: int
    node_id: int
    shares: tuple[Share, ...]
    reason: str = "placed"


PLACING_FIELDS = ("state", "gpu_limit", "gpu_count", "max_duration_s", "kind", "source", "attempt",
                  "team__interactive_max_s")

# Called on each reservation about to be placed (its new node, times and state already set);
# returns the names of any further fields it set, written in the same statement.
Prepare = Callable[[Reservation], Iterable[str]]


def place(reservation_id: int, node_id: int, shares: Iterable[Share], actor="system:scheduler",
          reason: str = "placed") -> Reservation:
    """Commit one placement decision. Raises CapacityConflict (or IllegalTransition) when it no
    longer fits, leaving nothing written."""
    placed, refused = place_many([[Decision(reservation_id, node_id, tuple(shares), reason)]], actor)
    if refused:
        raise refused[reservation_id]
    return placed[0]


def place_many(units: Sequence[Sequence[Decision]], actor="system:scheduler",
               prepare: Prepare | None = None) -> tuple[list[Reservation], dict[int, Exception]]:
    """Commit many placement decisions in one transaction with a constant number of queries:
    lock the reservations and then the GPU rows (both in id order, so concurrent callers cannot
    deadlock), re-check every GPU's free capacity against the live allocations, and write the
    allocations, the reservations and their audit rows in bulk.

    A unit (one reservation, or the members of a gang) is placed whole or not at all; one that
    no longer fits is left untouched and reported as {reservation id: CapacityConflict or
    IllegalTransition} for each of its members. Returns (placed reservations, refused)."""
    decisions = [d for unit in units for d in unit]
    if not decisions:
        return [], {}
    refused: dict[int, Exception] = {}
    with transaction.atomic():
        # Only the fields placing reads (a batch locks hundreds); others load on access.
        reservations = {r.pk: r for r in Reservation.objects.select_for_update(of=("self",)).select_related("team")
                        .only(*PLACING_FIELDS).filter(pk__in={d.reservation_id for d in decisions}).order_by("pk")}
        nodes = {n.pk: n for n in Node.objects.filter(pk__in={d.node_id for d in decisions}).only("name", "status")}
        gpu_ids = sorted({s.gpu_id for d in decisions for s in d.shares})
        gpus = {g.pk: g for g in Gpu.objects.select_for_update().filter(pk__in=gpu_ids).order_by("pk")
                .only("node_id", "uuid", "memory_mib")}
        taken = {gpu_id: [share, memory] for gpu_id, share, memory in
                 Allocation.objects.filter(gpu_id__in=gpu_ids, released_at__isnull=True).values("gpu_id")
                 .annotate(share=Sum("compute_share"), memory=Sum("memory_mib"))
                 .values_list("gpu_id", "share", "memory")}
        accepted: list[Decision] = []
        claimed: set[int] = set()
        for unit in units:
            try:
                adds = _check_unit(unit, reservations, nodes, gpus, taken, claimed)
            except (CapacityConflict, IllegalTransition, Reservation.DoesNotExist) as exc:
                refused.update((d.reservation_id, exc) for d in unit)
                continue
            for gpu_id, (share, memory) in adds.items():
                used = taken.setdefault(gpu_id, [Decimal(0), 0])
                used[0] += share
                used[1] += memory
            claimed.update(d.reservation_id for d in unit)
            accepted.extend(unit)
        if accepted:
            _write_placements(accepted, reservations, actor, prepare)
    return [reservations[d.reservation_id] for d in accepted], refused


def _check_unit(unit: Sequence[Decision], reservations: dict[int, Reservation], nodes: dict[int, Node],
                gpus: dict[int, Gpu], taken: dict[int, list], claimed: set[int]) -> dict[int, tuple[Decimal, int]]:
    """What the unit adds to each GPU, if all of it still fits; raises otherwise."""
    adds: dict[int, tuple[Decimal, int]] = {}
    for d in unit:
        reservation = reservations.get(d.reservation_id)
        if reservation is None:
            raise Reservation.DoesNotExist(f"reservation {d.reservation_id} does not exist")
        if d.reservation_id in claimed:  # placed by an earlier unit of this commit
            raise IllegalTransition(State.PLACED, State.PLACED)
        check_transition(reservation.state, State.PLACED)
        node = nodes.get(d.node_id)
        if node is None or node.status != NodeStatus.READY:
            raise CapacityConflict(f"node {node.name if node else d.node_id} is "
                                   f"{node.status if node else 'gone'}")
        if not d.shares:
            raise CapacityConflict(f"reservation {d.reservation_id}: a placement needs at least one GPU")
        for s in d.shares:
            gpu = gpus.get(s.gpu_id)
            if gpu is None or gpu.node_id != node.pk:
                raise CapacityConflict(f"GPU {s.gpu_id} is not on node {node.name}")
            share, memory = adds.get(s.gpu_id, (Decimal(0), 0))
            share, memory = share + s.compute_share, memory + s.memory_mib
            used_share, used_memory = taken.get(s.gpu_id, (Decimal(0), 0))
            if used_share + share > 1 or used_memory + memory > gpu.memory_mib:
                raise CapacityConflict(f"GPU {gpu.uuid} no longer has room for this share")
            adds[s.gpu_id] = (share, memory)
    return adds


def _write_placements(accepted: list[Decision], reservations: dict[int, Reservation], actor,
                      prepare: Prepare | None) -> None:
    now = timezone.now()
    rows = [reservations[d.reservation_id] for d in accepted]
    before = {r.state for r in rows}  # check_transition let only `pending` through
    for d, r in zip(accepted, rows, strict=True):
        r.node_id = d.node_id
        r.placed_at = r.updated_at = now
        r.expires_at = now + timedelta(seconds=r.max_duration_s) if r.max_duration_s else None
        r.state, r.state_reason = State.PLACED, d.reason[:500]
    fields = {"node", "state_reason", "expires_at"}
    if prepare is not None:
        for r in rows:
            fields.update(prepare(r))
    # Written as plain rows, not through bulk_create/bulk_update: see portal.bulk for the cost.
    insert_rows(Allocation, ["reservation", "gpu", "compute_share", "compute_limit", "memory_mib"], [
        (r.pk, s.gpu_id, s.compute_share, r.gpu_limit if r.gpu_count == 1 else s.compute_share, s.memory_mib)
        for d, r in zip(accepted, rows, strict=True) for s in sorted(d.shares, key=lambda s: s.gpu_id)
    ], same={"created_at": now, "released_at": None})
    # Fields prepare() set to one value for every row travel once.
    varying = sorted(f for f in fields if len({getattr(r, Reservation._meta.get_field(f).attname) for r in rows}) > 1)
    same = {f: getattr(rows[0], Reservation._meta.get_field(f).attname) for f in fields - set(varying)}
    update_rows(rows, varying, same | {"state": State.PLACED, "placed_at": now, "updated_at": now})
    (from_state,) = before
    insert_rows(StateTransition, ["reservation", "reason"], [(r.pk, r.state_reason) for r in rows], same={
        "from_state": from_state, "to_state": State.PLACED,
        "actor": None if actor is None or isinstance(actor, str) else actor.pk,
        "actor_label": _actor_label(actor), "at": now})
    for node_id in sorted({d.node_id for d in accepted}):
        announce_allocations(node_id)
    announce_reservations({r.pk: r.team_id for r in rows})


def note_pending_reason(reservation_id: int, reason: str) -> None:
    """Store why a pending reservation is not placed yet (shown by the API as state_reason)."""
    rows = Reservation.objects.filter(pk=reservation_id, state=State.PENDING)
    if rows.update(state_reason=reason[:500]):
        announce_reservations(dict(rows.values_list("pk", "team_id")))


class ExtendRefused(Exception):
    """An extension the reservation or its team's policy does not allow; the message says why."""


def extend(reservation_id: int, actor, seconds: int) -> Reservation:
    """Give an active reservation `seconds` more before it expires, within the team's maximum
    duration (portal.tenancy.policy; site admins are not held to it). Audited as a transition to
    the same state. Raises ExtendRefused, writing nothing."""
    from portal.tenancy.policy import policy_of

    if seconds < 60:
        raise ExtendRefused("extend by at least one minute")
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().select_related("team").get(pk=reservation_id)
        if reservation.state not in (State.PENDING, *HOLDS_GPU):
            raise ExtendRefused(f"reservation {reservation.pk} is {reservation.state}; only a pending, placed "
                                "or running one can be extended")
        if reservation.state in HOLDS_GPU:
            if reservation.expires_at is None or reservation.placed_at is None:
                raise ExtendRefused(f"reservation {reservation.pk} has no end time; there is nothing to extend")
            current = int((reservation.expires_at - reservation.placed_at).total_seconds())
        elif reservation.max_duration_s is not None:
            current = reservation.max_duration_s
        elif reservation.kind == "interactive" and reservation.team.interactive_max_s:
            current = reservation.team.interactive_max_s
        else:
            raise ExtendRefused(f"reservation {reservation.pk} has no end time; there is nothing to extend")
        longest = policy_of(reservation.team).max_duration_s
        total = current + int(seconds)
        staff = not isinstance(actor, str) and actor is not None and actor.is_staff
        if total > longest and not staff:
            left = max(0, longest - current)
            raise ExtendRefused(
                f"team {reservation.team.slug} allows reservations of at most {longest / 3600:g} h; this one "
                f"would last {total / 3600:g} h" + (f" (you can add up to {left // 60} min)" if left >= 60 else ""))
        reservation.max_duration_s = total
        fields = ["max_duration_s", "updated_at"]
        if reservation.expires_at is not None:
            reservation.expires_at += timedelta(seconds=int(seconds))
            reservation.expiry_warned_at = None
            fields += ["expires_at", "expiry_warned_at"]
        reservation.save(update_fields=fields)
        _record(reservation, reservation.state, reservation.state, actor,
                f"extended by {seconds / 3600:g} h to {total / 3600:g} h")
        announce_reservations({reservation.pk: reservation.team_id})
    return reservation
