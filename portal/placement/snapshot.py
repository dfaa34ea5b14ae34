"""Translate database rows into the placement engine's frozen snapshot and requests."""

from __future__ import annotations

import time
from collections import defaultdict

from django.db.models import Prefetch

from portal.fleet.models import Gpu, Node
from portal.reservations.models import Allocation, Reservation
from portal.reservations.quota import usage_of
from portal.tenancy.models import Team
from scheduler import core


def _labels(value: str) -> frozenset[str]:
    return frozenset([value]) if value else frozenset()


def to_request(r: Reservation) -> core.Request:
    group = None
    if r.group_name:
        group = core.PodGroup(r.group_name, r.group_headcount or 1, float(r.group_threshold or 1))
    return core.Request(
        id=str(r.pk),
        team=r.team.slug,
        gpu_request=float(r.gpu_request),
        gpu_limit=float(r.gpu_limit),
        gpu_memory_mib=r.gpu_memory_mib,
        gpu_count=r.gpu_count,
        gpu_model=r.gpu_model or None,
        priority=r.priority,
        affinity=_labels(r.affinity),
        anti_affinity=_labels(r.anti_affinity),
        exclusion=_labels(r.exclusion),
        group=group,
        created_at=r.created_at.timestamp(),
    )


def build() -> core.Snapshot:
    """Nodes → GPUs → the live shares on them, and each team's quota use (for fair share)."""
    live = Allocation.objects.filter(released_at__isnull=True).select_related("reservation__team")
    shares: dict[int, list[core.Share]] = defaultdict(list)
    for a in live:
        r = a.reservation
        shares[a.gpu_id].append(core.Share(
            reservation_id=str(r.pk), request=float(a.compute_share), memory_mib=a.memory_mib,
            priority=r.priority, team=r.team.slug, affinity=_labels(r.affinity),
            anti_affinity=_labels(r.anti_affinity), exclusion=_labels(r.exclusion), group=r.group_name or None,
        ))
    nodes = []
    for node in Node.objects.prefetch_related(Prefetch("gpus", queryset=Gpu.objects.filter(healthy=True))):
        gpus = list(node.gpus.all())
        by_uuid = {g.uuid: g.index for g in gpus}
        nodes.append(core.Node(
            name=node.name,
            labels=dict(node.labels),
            status=core.NodeStatus(node.status),
            cpu_milli_free=None,
            memory_mib_free=None,
            gpus=tuple(
                core.Gpu(uuid=g.uuid, index=g.index, model=g.model, memory_mib=g.memory_mib,
                         nvlink_peers=frozenset(by_uuid[p] if isinstance(p, str) else p
                                                for p in g.nvlink_peers if not isinstance(p, str) or p in by_uuid),
                         numa_node=g.numa_node or 0, shares=tuple(shares.get(g.pk, ())))
                for g in gpus
            ),
        ))
    teams = {t.slug: core.TeamUsage(float(t.quota_gpu_share), float(usage_of(t).gpu_share))
             for t in Team.objects.all()}
    return core.Snapshot(nodes=tuple(nodes), teams=teams, now=time.time())
