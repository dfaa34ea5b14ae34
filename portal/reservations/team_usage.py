"""A team's quota at a glance: guaranteed share, what is in use, opportunistic use beyond it,
per member, and the requests still waiting with the reason each one waits."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import Count, DecimalField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Coalesce

from portal.tenancy.models import Team
from portal.tenancy.policy import policy_of

from .models import COUNTED, Admission, Reservation
from .quota import usage_of
from .states import ACTIVE, HOLDS_GPU, State

ZERO = Decimal("0.000")


@dataclass(frozen=True)
class MemberUse:
    username: str
    guaranteed: Decimal
    opportunistic: Decimal
    memory_mib: int
    active: int
    waiting: int


@dataclass(frozen=True)
class Waiting:
    id: int
    owner: str
    name: str
    share: Decimal
    gpu_count: int
    gpu_model: str
    priority: int
    reason: str
    queue_position: int | None
    estimated_start: object
    created_at: object


@dataclass(frozen=True)
class TeamUsage:
    quota_gpu_share: Decimal
    quota_memory_mib: int
    quota_max_gpus: int
    guaranteed_in_use: Decimal
    memory_in_use_mib: int
    gpus_in_use: int
    opportunistic_in_use: Decimal
    allow_over_quota: bool
    members: list[MemberUse] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    waiting_total: int = 0

    def as_dict(self) -> dict:
        def s(v):
            return str(v) if isinstance(v, Decimal) else v

        return {
            "quota": {"gpu_share": s(self.quota_gpu_share), "memory_mib": self.quota_memory_mib,
                      "gpus": self.quota_max_gpus},
            "in_use": {"gpu_share": s(self.guaranteed_in_use), "memory_mib": self.memory_in_use_mib,
                       "gpus": self.gpus_in_use},
            "opportunistic_in_use": s(self.opportunistic_in_use),
            "allow_over_quota": self.allow_over_quota,
            "members": [{k: s(v) for k, v in vars(m).items()} for m in self.members],
            "waiting": [{k: (v.isoformat() if hasattr(v, "isoformat") else s(v)) for k, v in vars(w).items()}
                        for w in self.waiting],
            "waiting_total": self.waiting_total,
        }


def team_usage(team: Team, waiting_limit: int = 50) -> TeamUsage:
    guaranteed = usage_of(team)
    share = ExpressionWrapper(F("gpu_request") * F("gpu_count"), output_field=DecimalField(max_digits=8,
                                                                                           decimal_places=3))
    memory = ExpressionWrapper(F("gpu_memory_mib") * F("gpu_count"), output_field=DecimalField(max_digits=14,
                                                                                               decimal_places=0))
    active = Reservation.objects.filter(team=team, state__in=ACTIVE)
    # Quota is charged while a reservation holds GPUs: guaranteed and borrowed count, opportunistic not.
    counted = Q(admission__in=COUNTED, state__in=HOLDS_GPU)
    beyond = Q(admission=Admission.OPPORTUNISTIC, state__in=HOLDS_GPU)
    opportunistic = active.filter(beyond).aggregate(s=Coalesce(Sum(share), Value(ZERO)))["s"]
    rows = (active.values("owner__username").annotate(
        g_share=Coalesce(Sum(share, filter=counted), Value(ZERO)),
        o_share=Coalesce(Sum(share, filter=beyond), Value(ZERO)),
        mem=Coalesce(Sum(memory, filter=counted), Value(Decimal(0))),
        n_held=Count("id", filter=Q(state__in=HOLDS_GPU)),
        n_waiting=Count("id", filter=Q(state=State.PENDING)),
    ).order_by("owner__username"))
    members = [MemberUse(r["owner__username"], Decimal(r["g_share"]).quantize(ZERO),
                         Decimal(r["o_share"]).quantize(ZERO), int(r["mem"]), r["n_held"], r["n_waiting"])
               for r in rows]
    pending = active.filter(state=State.PENDING).select_related("owner").order_by("queue_position", "created_at")
    waiting = [Waiting(r.pk, r.owner.username, r.name, r.gpu_request, r.gpu_count, r.gpu_model, r.priority,
                       r.state_reason, r.queue_position, r.estimated_start, r.created_at)
               for r in pending[:waiting_limit]]
    return TeamUsage(
        quota_gpu_share=team.quota_gpu_share, quota_memory_mib=team.quota_memory_mib,
        quota_max_gpus=team.quota_max_gpus, guaranteed_in_use=guaranteed.gpu_share,
        memory_in_use_mib=guaranteed.memory_mib, gpus_in_use=guaranteed.gpus,
        opportunistic_in_use=Decimal(opportunistic).quantize(ZERO), allow_over_quota=policy_of(team).allow_over_quota,
        members=members, waiting=waiting, waiting_total=pending.count(),
    )
