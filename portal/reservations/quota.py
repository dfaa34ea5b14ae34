"""What teams hold against their quotas: the live allocations, per team, GPU model and admission.

Quota is charged when a reservation is placed (what waits is demand, not use), as Kueue and KAI
do: a request beyond its team's quota waits or borrows instead of being refused at submit
(`portal.reservations.engine_quotas` and `scheduler.core.fairshare` decide which).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Sum

from portal.precompiled import Precompiled, param_eq

from .models import COUNTED, Allocation

ZERO = Decimal("0.000")
MILLI = Decimal("0.001")


@dataclass(frozen=True)
class Usage:
    """Held now: GPU share (whole GPUs count 1.0), GPU memory, GPUs."""

    gpu_share: Decimal
    memory_mib: int
    gpus: int

    def as_dict(self) -> dict:
        return {"gpu_share": str(self.gpu_share), "memory_mib": self.memory_mib, "gpus": self.gpus}

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpu_share + other.gpu_share, self.memory_mib + other.memory_mib, self.gpus + other.gpus)


NO_USAGE = Usage(ZERO, 0, 0)


def _usage(share, memory, gpus) -> Usage:
    return Usage(Decimal(share or 0).quantize(MILLI), int(memory or 0), int(gpus or 0))


def _held():
    return (Allocation.objects.filter(released_at__isnull=True).order_by()
            .values("reservation__team_id", "gpu__model", "reservation__admission")
            .annotate(share=Sum("gpu_request"), memory=Sum("gpu_memory_mib"), gpus=Count("id")))


# Every cycle, capacity preview and quota page asks: compiled once (portal.precompiled).
_HELD = Precompiled(lambda: _held().values_list("reservation__team_id", "gpu__model", "reservation__admission",
                                                "share", "memory", "gpus"))
_HELD_BY_TEAM = Precompiled(lambda: _held().filter(param_eq("reservation__team_id", "team"))
                            .values_list("reservation__team_id", "gpu__model", "reservation__admission",
                                         "share", "memory", "gpus"))


def held(team: int | None = None) -> dict[tuple[int, str, str], Usage]:
    """(team id, GPU model, admission) → what the team's reservations hold now; one team's or all."""
    rows = _HELD.all() if team is None else _HELD_BY_TEAM.all(team=team)
    return {(team_id, model, admission): _usage(*sums) for team_id, model, admission, *sums in rows}


def usage_of(team) -> Usage:
    """What the team holds that counts against its quotas (guaranteed + borrowed), every model."""
    total = NO_USAGE
    for (_, _, admission), use in held(team if isinstance(team, int) else team.pk).items():
        if admission in COUNTED:
            total += use
    return total


def usage_by_team() -> dict[int, Usage]:
    """usage_of for every team that holds anything counted (team id → usage; absent: NO_USAGE)."""
    out: dict[int, Usage] = {}
    for (team_id, _, admission), use in held().items():
        if admission in COUNTED:
            out[team_id] = out.get(team_id, NO_USAGE) + use
    return out
