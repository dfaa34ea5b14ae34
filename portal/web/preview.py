"""The request page's feasibility preview: where a request could start now, the quota left after
it, and if it cannot start now why, where it would stand in the queue and a rough start.

The same engine as the placement cycle (`scheduler.core.feasible_gpus` on a fresh snapshot) and the
same queue estimate as the cycle's (`portal.placement.cycle.update_queue`: the k-th waiting
reservation may start when the k-th known end among the running ones comes)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from portal.placement import snapshot
from portal.reservations import rules
from portal.reservations.models import Reservation
from portal.reservations.quota import over_quota, usage_of
from portal.reservations.states import HOLDS_GPU, State
from scheduler import core

from .forms import in_words

REASON_WORDS = {
    "quota": "your team's quota", "model": "GPU model", "exclusion": "exclusion group",
    "affinity": "affinity", "anti_affinity": "anti-affinity", "memory": "not enough free memory",
    "compute": "not enough free compute", "whole_gpu": "needs whole free GPUs", "no_fit": "no GPU fits",
    "node_not_ready": "node not ready", "node_cpu": "node CPU", "node_memory": "node memory",
}


@dataclass
class Preview:
    fits_now: bool = False
    models: list[tuple[str, int]] = field(default_factory=list)  # (model, GPUs that could take it)
    nodes: list[str] = field(default_factory=list)
    quota_problem: str = ""
    share_left_after: Decimal | None = None
    memory_left_after_mib: int | None = None
    reasons: list[dict] = field(default_factory=list)
    queue_position: int | None = None
    estimated_start: datetime | None = None
    opportunistic: bool = False


def preview(spec: rules.ReservationSpec) -> Preview:
    """`spec` has passed rules.check (so its numbers are normalised)."""
    out = Preview()
    team = spec.team
    usage = usage_of(team)
    share = spec.gpu_request * spec.gpu_count
    memory = spec.gpu_memory_mib * spec.gpu_count
    out.quota_problem = in_words(over_quota(team, usage, share, memory, spec.gpu_count) or "")
    if out.quota_problem and spec.priority == 0 and team.allow_over_quota:
        out.opportunistic, out.quota_problem = True, ""
    counted = Decimal(0) if out.opportunistic else share
    out.share_left_after = team.quota_gpu_share - usage.gpu_share - counted
    out.memory_left_after_mib = team.quota_memory_mib - usage.memory_mib - (0 if out.opportunistic else memory)
    group = core.PodGroup(spec.group_name, spec.group_headcount or 1, float(spec.group_threshold or 1)) \
        if spec.group_name else None
    request = core.Request(
        id="preview", team=team.slug, gpu_request=float(spec.gpu_request), gpu_limit=float(spec.gpu_limit),
        gpu_memory_mib=spec.gpu_memory_mib, gpu_count=spec.gpu_count, gpu_model=spec.gpu_model or None,
        priority=spec.priority, affinity=frozenset([spec.affinity]) if spec.affinity else frozenset(),
        anti_affinity=frozenset([spec.anti_affinity]) if spec.anti_affinity else frozenset(),
        exclusion=frozenset([spec.exclusion]) if spec.exclusion else frozenset(), group=group)
    candidates, refused = core.feasible_gpus(_fleet_snapshot(), request)
    by_model = Counter(c.model for c in candidates)
    out.models = sorted(by_model.items())
    out.nodes = sorted({c.node for c in candidates})
    out.fits_now = bool(candidates) and not out.quota_problem
    if out.quota_problem:
        out.reasons.append({"code": "quota", "what": REASON_WORDS["quota"], "message": out.quota_problem})
    if not candidates:
        for r in refused:
            out.reasons.append({"code": str(r.code), "what": REASON_WORDS.get(str(r.code), str(r.code)),
                                "message": in_words(r.message)})
    if not out.fits_now and not out.quota_problem:
        out.queue_position, out.estimated_start = _queue_place(spec.priority)
    return out


_snapshot_lock = threading.Lock()
_snapshot: tuple[float, core.Snapshot] | None = None
SNAPSHOT_FRESH_S = 2.0


def _fleet_snapshot() -> core.Snapshot:
    """The fleet as the placement cycle sees it, re-read at most every SNAPSHOT_FRESH_S per
    process: a person typing sends a preview every few hundred milliseconds, and a preview two
    seconds old is as good as a fresh one (the cycle decides on its own snapshot anyway)."""
    global _snapshot
    with _snapshot_lock:
        if _snapshot is not None and time.monotonic() - _snapshot[0] < SNAPSHOT_FRESH_S:
            return _snapshot[1]
    built = snapshot.build()
    with _snapshot_lock:
        _snapshot = (time.monotonic(), built)
    return built


def forget_snapshot() -> None:
    """The next preview reads the fleet again (a process whose fleet was replaced: tests)."""
    global _snapshot
    with _snapshot_lock:
        _snapshot = None


def _queue_place(priority: int) -> tuple[int, datetime | None]:
    ahead = Reservation.objects.filter(state=State.PENDING, priority__gte=priority).count()
    position = ahead + 1
    ends = list(Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__isnull=False)
                .order_by("expires_at").values_list("expires_at", flat=True)[position - 1:position])
    return position, max(ends[0], timezone.now()) if ends else None
