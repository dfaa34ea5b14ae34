"""Carry committed placements out on the cluster: create (or adopt) each placed reservation's pod.

Idempotent, so a task retried after a worker died mid-way, or run twice, changes nothing the
second time: the pod name is deterministic and `Backend.bind` adopts an existing pod. Transient
backend errors come back to the caller (the task retries them); permanent ones fail the
reservation with the backend's message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from django.conf import settings
from django.db import transaction

from portal.connect.access import app_env
from portal.precompiled import Precompiled, param_in
from portal.reservations import actors, services
from portal.reservations.events import announce_allocations
from portal.reservations.models import Allocation, Kind, Reservation, Source
from portal.reservations.states import State
from scheduler.backends import (
    Backend,
    BackendError,
    ExternalBinding,
    GpuShare,
    PermanentBackendError,
    PodRef,
    PodSpec,
    PodStatus,
    make_pod_spec,
)
from scheduler.backends.base import external_binding

from . import share_tokens

log = logging.getLogger(__name__)


# Every bind runs these with its own ids: compiled once (portal.precompiled).
_SHARES = Precompiled(lambda: Allocation.objects.filter(param_in("reservation_id", "ids"), released_at__isnull=True)
                      .order_by("reservation_id", "gpu__index")
                      .values_list("reservation_id", "gpu__uuid", "gpu__index", "gpu_request", "gpu_limit",
                                   "gpu_memory_mib"))


def shares_of(reservation_ids: Iterable[int]) -> dict[int, tuple[GpuShare, ...]]:
    """reservation id → its live GPU shares in GPU index order, read in one query."""
    out: dict[int, list[GpuShare]] = {}
    for rid, uuid, index, share, limit, memory in _SHARES.all(ids=list(reservation_ids)):
        out.setdefault(rid, []).append(GpuShare(uuid=uuid, index=index, gpu_request=float(share),
                                                gpu_limit=float(max(limit, share)), gpu_memory_mib=memory))
    return {rid: tuple(gpus) for rid, gpus in out.items()}


class BindRow(NamedTuple):
    """What binding reads of a placed reservation: a batch reads hundreds, as plain tuples."""

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
    client_node_name: str | None  # a remote share's pod runs there (its GPU is on node_name)
    node_address: str | None  # the GPU node's address as the cluster reports it (None: unknown)
    app: str  # the app the portal opens for the owner (portal.connect), "" for none
    app_port: int | None

    @property
    def pod_node(self) -> str:
        return self.client_node_name or self.node_name


BIND_COLUMNS = ("pk", "attempt", "pod_namespace", "pod_name", "pod_uid", "image", "command", "priority", "kind",
                "source", "team__slug", "node_id", "node__name", "client_node__name", "node__address",
                "app", "app_port")

_BIND_ROWS = Precompiled(lambda: Reservation.objects.filter(param_in("pk", "ids"), state=State.PLACED,
                                                            node__isnull=False).order_by().values_list(*BIND_COLUMNS))


def pod_spec(r: BindRow, gpus: tuple[GpuShare, ...]) -> PodSpec:
    remote = None
    if r.client_node_name:  # a remote share: the pod reaches its GPU on node_name over the network
        remote = share_tokens.remote_env(str(r.pk), r.attempt, r.node_name, r.node_address, gpus[0], r.priority)
    return make_pod_spec(
        reservation_id=str(r.pk), attempt=r.attempt, namespace=r.pod_namespace, node=r.pod_node,
        team=r.team_slug, image=r.image, command=tuple(r.command), gpus=gpus, priority=r.priority, kind=r.kind,
        simulated_duration_s=float(settings.TESSERA_LOCAL_BATCH_S) if r.kind == Kind.BATCH else None,
        remote_env=remote, extra_env=app_env(r.pk, r.app, r.app_port),
    )


def bind(backend: Backend, reservation_id: int) -> PodStatus | None:
    """Create the pod of one placed reservation (`bind_batch` of one) and tell its node's agent.
    Returns the pod, or None when there is nothing (more) to do or the pod is a kubectl one.
    A transient backend error is raised, for the caller to retry."""
    report = bind_batch(backend, [reservation_id])
    if reservation_id in report.transient:
        raise report.transient[reservation_id]
    announce(report.nodes)
    return report.pods.get(reservation_id)


def announce(node_ids: Iterable[int]) -> None:
    """Each agent hears once of the new pod uids on its node."""
    with transaction.atomic():
        for node_id in sorted(node_ids):
            announce_allocations(node_id)


@dataclass
class BindReport:
    bound: int = 0
    pods: dict[int, PodStatus] = field(default_factory=dict)  # reservation id → the pod made or adopted
    transient: dict[int, BackendError] = field(default_factory=dict)  # met a transient error: retry these
    nodes: set[int] = field(default_factory=set)  # whose agents must hear of new pod uids


def bind_batch(backend: Backend, reservation_ids: Iterable[int]) -> BindReport:
    """`bind` for many reservations with a constant number of queries: the rows and their shares
    are read at once, the pods go to `backend.bind_many` together (the kubectl ones, already
    existing, to `backend.bind_external_many`), and the pod uids are written in one statement. The caller
    announces `report.nodes` to their agents."""
    report = BindReport()
    rows = {r.pk: r for r in map(BindRow._make, _BIND_ROWS.all(ids=list(reservation_ids)))}
    shares = shares_of(list(rows))
    work = [(rows[pk], shares[pk]) for pk in sorted(rows) if pk in shares]
    outcomes: list[tuple[BindRow, PodStatus | BackendError | None]] = []
    specs: list[tuple[BindRow, PodSpec]] = []
    for r, gpus in work:
        if r.source == Source.KUBECTL:
            continue
        try:
            specs.append((r, pod_spec(r, gpus)))
        except PermanentBackendError as exc:  # e.g. a remote share's GPU node has no secret
            outcomes.append((r, exc))
    if specs:
        outcomes += zip([r for r, _ in specs], backend.bind_many([spec for _, spec in specs]), strict=True)
    kubectl = [(r, ExternalBinding(PodRef(r.pod_namespace, r.pod_name), r.pod_node,
                                   *external_binding(str(r.pk), r.team_slug, gpus, r.priority)))
               for r, gpus in work if r.source == Source.KUBECTL]
    if kubectl:  # side by side: one pod's Binding need not wait for the next one's claim write
        outcomes += zip([r for r, _ in kubectl], backend.bind_external_many([b for _, b in kubectl]), strict=True)

    created: list[tuple[BindRow, PodStatus]] = []
    for r, outcome in outcomes:
        if isinstance(outcome, PermanentBackendError):
            services.release(r.pk, State.FAILED, f"the cluster refused the pod: {outcome}", actors.PLACEMENT)
        elif isinstance(outcome, BackendError):
            report.transient[r.pk] = outcome
        else:
            report.bound += 1
            if outcome is not None:
                report.pods[r.pk] = outcome
                created.append((r, outcome))
    if created:
        report.nodes |= services.record_pods(created, actors.PLACEMENT)
    if report.transient or created:
        services.note_cluster_waits({pk: str(exc) for pk, exc in report.transient.items()},
                                    [r.pk for r, _ in created])
    return report
