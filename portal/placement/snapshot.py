"""Translate database rows into the placement engine's frozen snapshot and requests."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from portal.fleet.models import DrainState, NodeLink, NodeStatus, PlannedDrain
from portal.precompiled import Precompiled, param_in
from portal.reservations import engine_quotas
from portal.reservations.models import Allocation, Reservation, StateTransition
from portal.reservations.requests import exclusion_of, labels, request_of
from portal.reservations.states import HOLDS_GPU, State
from portal.tenancy.models import TeamPolicy
from scheduler import core
from scheduler.core.fairqueue import EVICTION_WINDOW_S
from scheduler.core.remote import Link

from . import bookings_feed, fleet_cache, foreign_claims


class Pending(NamedTuple):
    """What a cycle reads of a waiting reservation (it may read thousands: plain tuples)."""

    pk: int
    team_slug: str
    gpu_request: Decimal
    gpu_limit: Decimal
    gpu_memory_mib: int
    gpu_count: int
    gpu_model: str
    priority: int
    affinity: str
    anti_affinity: str
    exclusion: str
    group_name: str
    group_headcount: int | None
    group_threshold: Decimal | None
    created_at: datetime
    state_reason: str
    remote_allowed: bool


# Every cycle runs it with the ids it looks at: compiled once (portal.precompiled).
_PENDING = Precompiled(lambda: Reservation.objects.filter(param_in("pk", "ids"), state=State.PENDING)
                       .order_by("created_at", "id").values_list("pk", "team__slug", *Pending._fields[2:]))


def pending(ids: list[int]) -> list[Pending]:
    """The reservations among `ids` that still wait, oldest first."""
    return [Pending._make(row) for row in _PENDING.all(ids=ids)]


def to_request(r: Pending) -> core.Request:
    return request_of(r, r.team_slug, str(r.pk), r.created_at)


def remote_teams() -> set[str]:
    """The teams whose policy lets their requests use remote shares."""
    return set(TeamPolicy.objects.filter(allow_remote=True).values_list("team__slug", flat=True))


def links() -> dict[tuple[str, str], Link]:
    """(node a pod would run on, GPU node) → the link its agent measured lately (portal.fleet.NodeLink)."""
    fresh = timezone.now() - timezone.timedelta(seconds=settings.TESSERA_LINK_MAX_AGE_S)
    return {(c, g): Link(c, g, rtt, mbps) for c, g, rtt, mbps in NodeLink.objects.filter(measured_at__gte=fresh)
            .values_list("client__name", "gpu_node__name", "rtt_ms", "bandwidth_mbps")}


# Every cycle (and capacity preview) reads these: compiled once (portal.precompiled).
_LIVE_SHARES = Precompiled(lambda: Allocation.objects.filter(released_at__isnull=True).order_by().values_list(
    "gpu_id", "reservation_id", "gpu_request", "gpu_memory_mib", "reservation__priority", "reservation__team__slug",
    "reservation__affinity", "reservation__anti_affinity", "reservation__exclusion", "reservation__group_name",
    "reservation__admission", "reservation__placed_at", "reservation__reclaim_at"))
_POD_NODES = Precompiled(lambda: Reservation.objects.filter(state__in=HOLDS_GPU, node__isnull=False).order_by()
                         .values_list(Coalesce("client_node_id", "node_id"), flat=True))


def planned_drains(now: datetime) -> tuple[core.PlannedDrain, ...]:
    """The planned drains the forecast counts (`fleet.PlannedDrain`): those still to start (one due
    but not applied yet only on a ready node: a person's drain stands), and those draining their node
    now, which return it at their end."""
    rows = (PlannedDrain.objects
            .filter(Q(state=DrainState.PLANNED, starts_at__gt=now)
                    | Q(state=DrainState.PLANNED, node__status=NodeStatus.READY)
                    | Q(state=DrainState.ACTIVE, applied=True))
            .order_by("starts_at", "pk").values_list("node__name", "starts_at", "ends_at"))
    return tuple(core.PlannedDrain(name, start.timestamp(), end.timestamp() if end else None)
                 for name, start, end in rows)


def past_evictions(now: datetime) -> dict[str, list[float]]:
    """Reservation holding a GPU → when it was preempted before (it was requeued), over the last two
    eviction windows: the engine leaves a job evicted again and again alone for a while
    (`scheduler.core.fairqueue.EVICTION_CAP`)."""
    since = now - timezone.timedelta(seconds=2 * EVICTION_WINDOW_S)
    out: dict[str, list[float]] = defaultdict(list)
    rows = StateTransition.objects.filter(to_state=State.PREEMPTED, at__gte=since, reservation__state__in=HOLDS_GPU)
    for rid, at in rows.order_by().values_list("reservation_id", "at"):
        out[str(rid)].append(at.timestamp())
    return dict(out)


def _pods_per_node() -> Counter:
    """node id → pods of reservations holding a GPU there (a remote share's pod is on its client node)."""
    return Counter(_POD_NODES.all())


def _free(allocatable: int, pods: int, per_pod: int) -> int | None:
    return max(0, allocatable - pods * per_pod) if allocatable else None  # 0: the node did not say, never a reason


def build(booked: tuple[core.Booking, ...] | None = None) -> core.Snapshot:
    """Nodes → GPUs → the live shares on them (how each was admitted, since when, and when a
    reclaimed one goes), the quota tree (departments, teams, quotas per model: fair share) and the
    booked windows with the known run times of what waits (`bookings_feed`; `booked`: read already).
    The nodes and GPUs come from fleet_cache (read again only when their rows changed); the
    shares, pods and quotas are read every time, as plain values: a cycle needs them fresh."""
    shares: dict[int, list[core.Share]] = defaultdict(list)
    for (gpu_id, rid, share, memory, priority, team, affinity, anti, exclusion, group, admission, placed_at,
         reclaim_at) in _LIVE_SHARES.all():
        shares[gpu_id].append(core.Share(
            reservation_id=str(rid), gpu_request=float(share), gpu_memory_mib=memory, priority=priority, team=team,
            affinity=labels(affinity), anti_affinity=labels(anti), exclusion=exclusion_of(team, exclusion),
            group=group or None, admission=admission, since=placed_at.timestamp() if placed_at else 0.0,
            reclaim_at=reclaim_at.timestamp() if reclaim_at else None,
        ))
    pods = _pods_per_node()
    fleet = fleet_cache.fleet()
    for gpu_id, held in foreign_claims.shares_by_gpu(fleet).items():  # the kube-scheduler's DRA allocations
        shares[gpu_id].extend(held)
    # Most nodes hold nothing: they stay the fleet's blank ones; only those with shares or pods change.
    nodes = list(fleet.blanks)
    touched = {fleet.position_of_gpu[pk] for pk in shares if pk in fleet.position_of_gpu}
    touched.update(fleet.position_of_node[pk] for pk in pods if pk in fleet.position_of_node)
    for i in sorted(touched):
        node = fleet.nodes[i]
        busy = pods[node.pk]
        nodes[i] = replace(
            node.blank,
            cpu_milli_free=_free(node.cpu_milli, busy, settings.TESSERA_POD_CPU_MILLI),
            memory_mib_free=_free(node.memory_mib, busy, settings.TESSERA_POD_MEMORY_MIB),
            gpus=tuple(replace(gpu, shares=tuple(shares[pk])) if pk in shares else gpu
                       for pk, gpu in zip(node.gpu_pks, node.blank.gpus, strict=True)),
        )
    # Django's clock: the same as the rows' timestamps (created_at, placed_at, reclaim_at).
    now = timezone.now()
    if booked is None:
        booked = bookings_feed.bookings(now)
    return core.Snapshot(nodes=tuple(nodes), now=now.timestamp(), layout=fleet.layout, quotas=engine_quotas.load(),
                         past_use=engine_quotas.past_use(settings.TESSERA_FAIR_SHARE_HALF_LIFE_S, now),
                         bookings=booked, durations=bookings_feed.durations(booked))
