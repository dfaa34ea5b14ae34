"""`GET /api/v1/capacity/`: which GPUs could take a request now, or why none could."""

from __future__ import annotations

from decimal import Decimal

from rest_framework.exceptions import ValidationError

from portal.placement import snapshot
from portal.reservations.quota import over_quota, usage_of
from portal.reservations.rules import fleet_models
from portal.tenancy import roles
from scheduler import core


def answer(user, gpu_request: Decimal, gpu_memory_mib: int, gpu_model: str, gpu_count: int, team: str,
           limit: int) -> dict:
    """`limit`: the most GPUs listed, best first; `count` says how many could take the request."""
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
    reasons: list[dict] = []
    if team:
        row = roles.visible_teams(user).filter(slug=team).first()
        if row is None:
            raise ValidationError({"team": [f"no team '{team}' that you belong to"]})
        problem = over_quota(row, usage_of(row), gpu_request * gpu_count, gpu_memory_mib * gpu_count, gpu_count)
        if problem:
            reasons.append({"code": "quota", "message": problem, "count": 0})
    request = core.Request(id="capacity-query", team=team, gpu_request=float(gpu_request),
                           gpu_memory_mib=gpu_memory_mib, gpu_count=gpu_count, gpu_model=gpu_model or None,
                           priority=50)
    candidates, count, refused = core.best_gpus(snapshot.build(), request, limit)
    reasons += [r.as_dict() for r in refused]
    gpus = [{"uuid": c.gpu_uuid, "node": c.node, "index": c.gpu_index, "model": c.model,
             "free_share": round(c.free_share, 3), "free_memory_mib": c.free_memory_mib} for c in candidates]
    return {"fits": bool(gpus) and not any(r["code"] == "quota" for r in reasons), "gpus": gpus,
            "count": count, "reasons": reasons}
