"""Queue sort: priority first, then team fair share (usage / quota), then age; aging lifts the waiting."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .model import Request, TeamUsage

# Every this many seconds of waiting counts as one more priority point, so nothing starves.
DEFAULT_AGING_S = 300.0


def effective_priority(req: Request, now: float, aging_s: float = DEFAULT_AGING_S) -> int:
    waited = max(0.0, now - req.created_at)
    bonus = int(waited // aging_s) if aging_s > 0 else 0
    return min(100, req.priority + bonus)


def queue_order(
    pending: Sequence[Request],
    teams: Mapping[str, TeamUsage],
    now: float,
    aging_s: float = DEFAULT_AGING_S,
) -> list[Request]:
    def key(r: Request) -> tuple[int, float, float, str]:
        usage = teams.get(r.team)
        ratio = usage.ratio if usage is not None else 0.0
        return (
            -effective_priority(r, now, aging_s),
            ratio if math.isfinite(ratio) else 1e18,
            r.created_at,
            r.id,
        )

    return sorted(pending, key=key)
