"""The engine's request (`scheduler.core.Request`) of a reservation, built in one place: the
placement cycle (from a waiting row), the request page's preview, the capacity API and submit's
check all ask the engine about the same request, so they cannot disagree on its terms."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Protocol

from django.conf import settings

from scheduler import core


class Terms(Protocol):
    """What a request asks for: a ReservationSpec, a waiting row (placement.snapshot.Pending) or
    the capacity API's query all have these."""

    gpu_request: Decimal
    gpu_limit: Decimal | None
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


def labels(value: str) -> frozenset[str]:
    return frozenset([value]) if value else frozenset()


def exclusion_of(team: str, label: str) -> frozenset[str]:
    """Exclusion groups belong to a team (portal.tenancy.ExclusionGroup): vision's `secret` and
    nlp's `secret` are two groups whose workloads must not share a GPU, so the engine sees them
    as `vision/secret` and `nlp/secret`."""
    return frozenset([f"{team}/{label}"]) if label else frozenset()


def request_of(terms: Terms, team: str, rid: str, created_at: datetime | None = None) -> core.Request:
    """Raises ValueError (the engine's own checks) for terms it cannot take."""
    group = None
    if terms.group_name:
        group = core.PodGroup(terms.group_name, terms.group_headcount or 1, float(terms.group_threshold or 1))
    return core.Request(
        id=rid,
        team=team,
        gpu_request=float(terms.gpu_request),
        gpu_limit=float(terms.gpu_limit) if terms.gpu_limit is not None else None,
        gpu_memory_mib=terms.gpu_memory_mib,
        gpu_count=terms.gpu_count,
        gpu_model=terms.gpu_model or None,
        priority=terms.priority,
        affinity=labels(terms.affinity),
        anti_affinity=labels(terms.anti_affinity),
        exclusion=exclusion_of(team, terms.exclusion),
        group=group,
        created_at=created_at.timestamp() if created_at is not None else 0.0,
        # The pod's own needs, on the node it runs on (for a remote share: not the GPU's node).
        cpu_milli=settings.TESSERA_POD_CPU_MILLI,
        memory_mib=settings.TESSERA_POD_MEMORY_MIB,
    )
