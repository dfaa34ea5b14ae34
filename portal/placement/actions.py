"""Carry a committed decision out on the cluster: create (or adopt) the pod, delete a pod.

Both are idempotent, so a task retried after a worker died mid-way, or run twice, changes
nothing the second time: the pod name is deterministic and `Backend.bind` adopts an existing pod;
`unbind` of a missing pod is a no-op. Transient backend errors propagate (the task retries them);
permanent ones fail the reservation with the backend's message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from django.db import transaction

from portal.bulk import update_values
from portal.reservations import services
from portal.reservations.events import announce_allocations
from portal.reservations.models import Allocation, Kind, Reservation, Source
from portal.reservations.states import HOLDS_GPU, IllegalTransition, State
from scheduler.backends import (
    Backend,
    BackendError,
    GpuShare,
    PermanentBackendError,
    Phase,
    PodRef,
    PodSpec,
    PodStatus,
    make_pod_spec,
)
from scheduler.backends.base import external_binding

from .backend import simulated_batch_s

log = logging.getLogger(__name__)
ACTOR = "system:placement"
GRACE_S = 30


def shares_of(reservation_ids: Iterable[int]) -> dict[int, tuple[GpuShare, ...]]:
    """reservation id → its live GPU shares in GPU index order, read in one query."""
    out: dict[int, list[GpuShare]] = {}
    for rid, uuid, index, share, limit, memory in (
            Allocation.objects.filter(reservation_id__in=reservation_ids, released_at__isnull=True)
            .order_by("reservation_id", "gpu__index")
            .values_list("reservation_id", "gpu__uuid", "gpu__index", "compute_share", "compute_limit", "memory_mib")):
        out.setdefault(rid, []).append(GpuShare(uuid=uuid, index=index, request=float(share),
                                                limit=float(max(limit, share)), memory_mib=memory))
    return {rid: tuple(gpus) for rid, gpus in out.items()}


class Placed(NamedTuple):
    """What a bind reads of a placed reservation: a batch reads hundreds, as plain tuples."""

    pk: int
    attempt: int
    pod_namespace: str
    pod_name: str
    pod_uid: str
    image: str
    command: list
    priority: int
    kind: str
    source: str
    team_slug: str
    node_id: int
    node_name: str


PLACED_COLUMNS = ("pk", "attempt", "pod_namespace", "pod_name", "pod_uid", "image", "command", "priority", "kind",
                  "source", "team__slug", "node_id", "node__name")


def pod_spec(r: Placed, gpus: tuple[GpuShare, ...]) -> PodSpec:
    return make_pod_spec(
        reservation_id=str(r.pk), attempt=r.attempt, namespace=r.pod_namespace, node=r.node_name,
        team=r.team_slug, image=r.image, command=tuple(r.command), gpus=gpus, priority=r.priority, kind=r.kind,
        simulated_duration_s=simulated_batch_s() if r.kind == Kind.BATCH else None,
    )


def bind(backend: Backend, reservation_id: int) -> PodStatus | None:
    """Create the pod of one placed reservation (`bind_batch` of one) and tell its node's agent.
    Returns the pod, or None when there is nothing (more) to do or the pod is a kubectl one.
    A transient backend error is raised, for the caller to retry."""
    report = bind_batch(backend, [reservation_id])
    if reservation_id in report.transient:
        raise report.transient[reservation_id]
    with transaction.atomic():
        for node_id in sorted(report.nodes):
            announce_allocations(node_id)
    return report.pods.get(reservation_id)


@dataclass
class BindReport:
    bound: int = 0
    pods: dict[int, PodStatus] = field(default_factory=dict)  # reservation id → the pod made or adopted
    transient: dict[int, BackendError] = field(default_factory=dict)  # met a transient error: retry these
    nodes: set[int] = field(default_factory=set)  # whose agents must hear of new pod uids


def bind_batch(backend: Backend, reservation_ids: Iterable[int]) -> BindReport:
    """`bind` for many reservations with a constant number of queries: the rows and their shares
    are read at once, the pods go to `backend.bind_many` together (the kubectl ones, already
    existing, are bound one by one), and the pod uids are written in one statement. The caller
    announces `report.nodes` to their agents."""
    report = BindReport()
    rows = {r.pk: r for r in map(Placed._make, Reservation.objects.filter(
        pk__in=list(reservation_ids), state=State.PLACED, node__isnull=False).order_by().values_list(*PLACED_COLUMNS))}
    shares = shares_of(list(rows))
    work = [(rows[pk], shares[pk]) for pk in sorted(rows) if pk in shares]
    ours = [(r, gpus) for r, gpus in work if r.source != Source.KUBECTL]
    outcomes: list[tuple[Placed, PodStatus | BackendError | None]] = list(zip(
        [r for r, _ in ours], backend.bind_many([pod_spec(r, gpus) for r, gpus in ours]) if ours else [],
        strict=True))
    for r, gpus in work:
        if r.source == Source.KUBECTL:
            labels, annotations = external_binding(str(r.pk), r.team_slug, gpus, r.priority)
            try:
                backend.bind_external(PodRef(r.pod_namespace, r.pod_name), r.node_name, labels, annotations)
                outcomes.append((r, None))
            except BackendError as exc:
                outcomes.append((r, exc))

    created: list[tuple[Placed, PodStatus]] = []
    for r, outcome in outcomes:
        if isinstance(outcome, PermanentBackendError):
            _fail(r.pk, f"the cluster refused the pod: {outcome}")
        elif isinstance(outcome, BackendError):
            report.transient[r.pk] = outcome
        else:
            report.bound += 1
            if outcome is not None:
                report.pods[r.pk] = outcome
                created.append((r, outcome))
    if created:
        report.nodes |= _record_pods(created)
    return report


def _record_pods(created: list[tuple[Placed, PodStatus]]) -> set[int]:
    """Store the pods' uids where the reservation still names that pod (it may have been
    requeued meanwhile: a compare-and-set on pod_name), then move the ones already running.
    Returns the nodes whose agents must hear of the uids."""
    changed = [(r, status) for r, status in created if r.pod_name == status.name and r.pod_uid != status.uid]
    update_values(Reservation, ["pod_uid"], [(r.pk, status.uid, r.pod_name) for r, status in changed],
                  match=["pod_name"])
    for r, status in created:
        if status.phase == Phase.RUNNING:
            _move(r.pk, State.PLACED, State.RUNNING, f"pod {status.name} running on {status.node}")
    return {r.node_id for r, _ in changed}


def record_pod(reservation_id: int, status: PodStatus) -> int | None:
    """Remember the pod's uid (the agents attribute processes by it) and move on with its phase.
    Returns the node whose placements changed (its agent must hear of the uid), else None."""
    changed = Reservation.objects.filter(pk=reservation_id, pod_name=status.name).exclude(
        pod_uid=status.uid).update(pod_uid=status.uid)
    node_id = None
    if changed:
        node_id = Reservation.objects.values_list("node_id", flat=True).get(pk=reservation_id)
        with transaction.atomic():
            announce_allocations(node_id)
    if status.phase == Phase.RUNNING:
        _move(reservation_id, State.PLACED, State.RUNNING, f"pod {status.name} running on {status.node}")
    return node_id


def _move(reservation_id: int, expected: str, target: str, reason: str, actor: str = ACTOR) -> bool:
    """Transition only from `expected` (events may arrive late or twice)."""
    try:
        with transaction.atomic():
            current = Reservation.objects.select_for_update().values_list("state", flat=True).get(pk=reservation_id)
            if current != expected:
                return False
            services.transition(reservation_id, target, actor, reason)
        return True
    except (IllegalTransition, Reservation.DoesNotExist):
        return False


def _fail(reservation_id: int, reason: str) -> None:
    for state in (State.PLACED, State.RUNNING):
        if _move(reservation_id, state, State.FAILED, reason):
            return


def unbind(backend: Backend, namespace: str, name: str, reason: str, grace_s: int = GRACE_S) -> bool:
    if not namespace or not name:
        return False
    return backend.unbind(PodRef(namespace, name), grace_s, reason)


def release_ended_pods(backend: Backend, limit: int = 500) -> int:
    """Delete the pods of reservations that stopped holding GPUs (cancelled, preempted, expired,
    failed, requeued), then forget the pod name. A kubectl reservation still waiting keeps its
    pod: it is the request itself."""
    ended = (Reservation.objects.filter(pod_name__gt="").exclude(state__in=HOLDS_GPU)
             .exclude(source=Source.KUBECTL, state=State.PENDING)
             .values_list("pk", "state", "pod_namespace", "pod_name")[:limit])
    deleted = 0
    for pk, state, namespace, name in ended:
        try:
            if unbind(backend, namespace, name, f"reservation {pk} is {state}"):
                deleted += 1
        except BackendError as exc:  # tried again next cycle
            log.warning("could not delete pod %s/%s: %s", namespace, name, exc)
            continue
        Reservation.objects.filter(pk=pk, pod_name=name).exclude(state__in=HOLDS_GPU).update(pod_name="")
    return deleted
