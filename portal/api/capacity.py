"""`GET /api/v1/capacity/`: which GPUs could take a request now and how it would count against its
team's quotas, or why none could: the cycle's own judgement (`scheduler.core.judge`)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from rest_framework.exceptions import ValidationError

from portal.fleet.model_names import fleet_models
from portal.placement import snapshot
from portal.reservations.requests import request_of
from portal.reservations.rules import LABEL
from portal.tenancy import roles
from portal.tenancy.models import ExclusionGroup
from scheduler import core


@dataclass
class _Query:
    """The capacity query as request terms (reservations.requests.Terms)."""

    gpu_request: Decimal
    gpu_memory_mib: int
    gpu_count: int
    gpu_model: str
    gpu_limit: Decimal | None = None
    priority: int = 50
    affinity: str = ""
    anti_affinity: str = ""
    exclusion: str = ""
    group_name: str = ""
    group_headcount: int | None = None
    group_threshold: Decimal | None = None


def answer(user, gpu_request: Decimal, gpu_memory_mib: int, gpu_model: str, gpu_count: int, team: str,
           limit: int, priority: int = 50, exclusion: str = "", affinity: str = "", anti_affinity: str = "") -> dict:
    """`limit`: the most GPUs listed, best first; `count` says how many could take the request.
    With a team, `admission` says how it would count (guaranteed, borrowed, opportunistic; null:
    it would wait) and a quota reason says why it waits or can never run."""
    models = [m for m in gpu_model.split("|") if m]
    # Read only when models are named: it groups every GPU of the fleet (~2 ms of the portal's and
    # the database's CPU), and most previews name none.
    known = fleet_models() if models else {}
    unknown = [m for m in models if m not in known]
    if unknown:
        raise ValidationError({"gpu_model": [f"unknown GPU model {', '.join(unknown)}; known: "
                                             f"{', '.join(sorted(known)) or 'none'}"]})
    if gpu_count >= 2 and gpu_request != 1:
        raise ValidationError({"gpu_request": ["multi-GPU requests take whole cards: gpu_request must be 1.0"]})
    row = roles.visible_teams(user).filter(slug=team).first() if team else None
    if team and row is None:
        raise ValidationError({"team": [f"no team '{team}' that you belong to"]})
    for name, value in (("exclusion", exclusion), ("affinity", affinity), ("anti_affinity", anti_affinity)):
        if value and not LABEL.match(value):
            raise ValidationError({name: ["must be 1-63 letters, digits, '-', '_' or '.', starting and ending "
                                          "alphanumeric"]})
    if exclusion and (row is None or not ExclusionGroup.objects.filter(team=row, label=exclusion).exists()):
        raise ValidationError({"exclusion": [f"team {team or '(none given)'} has no exclusion group '{exclusion}'"]})
    terms = _Query(gpu_request, gpu_memory_mib, gpu_count, gpu_model, priority=priority, exclusion=exclusion,
                   affinity=affinity, anti_affinity=anti_affinity)
    request = request_of(terms, team, "capacity-query")
    fleet = snapshot.build()
    if not team:  # no team: where it fits, quota aside
        fleet = core.Snapshot(fleet.nodes, now=fleet.now, layout=fleet.layout)
    verdict = core.judge(fleet, request, limit)
    gpus = [{"uuid": c.gpu_uuid, "node": c.node, "index": c.gpu_index, "model": c.model,
             "free_share": round(c.free_share, 3), "free_memory_mib": c.free_memory_mib} for c in verdict.candidates]
    return {"fits": bool(gpus), "admission": str(verdict.admission) if verdict.admission and team else None,
            "never": verdict.never, "gpus": gpus, "count": verdict.count,
            "reasons": [r.as_dict() for r in verdict.reasons]}
