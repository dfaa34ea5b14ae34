"""The request page's feasibility preview: whether a request could start now and how it would count
(guaranteed, borrowed, opportunistic), the team's quotas it counts against, and if it cannot start
now why, where it would stand in the queue and when it may start.

The same decision as the placement cycle's (`scheduler.core.judge`: the cycle's quota verdicts,
filters and scoring on a fresh snapshot, for the request built by `reservations.requests`)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal

from portal.fleet.model_names import fleet_model_names
from portal.placement import queue, reasons, snapshot
from portal.reservations import quota, rules
from portal.reservations.models import COUNTED
from portal.reservations.requests import request_of
from scheduler import core

from .forms import in_words

REASON_WORDS = {
    "quota": "quota", "model": "GPU model", "exclusion": "exclusion group",
    "affinity": "affinity", "anti_affinity": "anti-affinity", "memory": "not enough free memory",
    "compute": "not enough free compute", "whole_gpu": "needs whole free GPUs", "no_fit": "no GPU fits",
    "node_not_ready": "node not ready", "node_cpu": "node CPU", "node_memory": "node memory",
}
ADMISSION_WORDS = {
    "guaranteed": "Guaranteed: within your team's quota",
    "borrowed": "Borrowed: beyond your team's quota, from capacity others lend now; may be reclaimed with "
                "{grace} warning",
    "opportunistic": "Opportunistic: priority 0 on idle capacity, counted in no quota; may be preempted at any time",
}


@dataclass
class QuotaLine:
    """One quota of the team that the request would count against (a model's, or `*`)."""

    bucket: str
    quota_share: Decimal
    held_share: Decimal
    quota_memory_mib: int
    held_memory_mib: int
    quota_gpus: int
    held_gpus: int


@dataclass
class Preview:
    fits_now: bool = False
    never: bool = False  # can never run as asked: submitting it is refused
    admission: str = ""  # how it would count if it started now ("" : it would wait)
    admission_text: str = ""
    models: list[tuple[str, int]] = field(default_factory=list)  # (model, GPUs that could take it)
    nodes: list[str] = field(default_factory=list)
    quota: list[QuotaLine] = field(default_factory=list)
    reasons: list[dict] = field(default_factory=list)
    queue_position: int | None = None
    estimated_start: datetime | None = None
    estimate_reason: str = ""  # why there is no estimated start


def preview(spec: rules.ReservationSpec) -> Preview:
    """`spec` has passed rules.check (so its numbers are normalised). The engine's own judgement
    (`scheduler.core.judge`) on the request built as submit and the cycle build it."""
    out = Preview()
    team = spec.team
    fleet = _fleet_snapshot()
    request = request_of(spec, team.slug, "preview")
    verdict = core.judge(fleet, request)
    out.never = verdict.never
    by_model = Counter(c.model for c in verdict.candidates)
    out.models = sorted(by_model.items())
    out.nodes = sorted({c.node for c in verdict.candidates})
    out.fits_now = verdict.admission is not None
    if verdict.admission is not None:
        out.admission = str(verdict.admission)
        grace = fleet.quotas.units[team.slug].reclaim_grace_s if fleet.quotas and team.slug in fleet.quotas.units \
            else 0
        out.admission_text = ADMISSION_WORDS[out.admission].format(grace=_minutes(grace))
    for r in verdict.reasons:
        if out.fits_now and r.code != core.ReasonCode.QUOTA:
            continue  # the GPUs it cannot use do not matter when others take it now
        if r.code == core.ReasonCode.NO_FIT:
            continue  # said by the badge: "Would wait"
        words = reasons.clause(r, request, subject=True) if r.code in (*reasons.ROOM, *reasons.LEFT_OUT) else ""
        out.reasons.append({"code": str(r.code), "what": REASON_WORDS.get(str(r.code), str(r.code)),
                            "message": words or in_words(r.message)})
    awaiting = 0 if out.fits_now else reasons.AwaitingApproval().count(request)
    if awaiting:
        out.reasons.append({"code": "awaiting_approval", "what": "left out",
                            "message": reasons.awaiting_text(awaiting)})
    out.quota = _quota_lines(fleet.quotas, team, spec)
    if not out.fits_now and not out.never:
        waiting = replace(request, id="preview", created_at=fleet.now)
        out.queue_position, out.estimated_start, out.estimate_reason = queue.estimate_for(fleet, waiting)
    return out


def _minutes(seconds: float) -> str:
    if seconds < 60:
        return f"{int(seconds)} s"
    return f"{seconds / 60:g} min"


def _quota_lines(tree, team, spec) -> list[QuotaLine]:
    """The team's quotas the request's models resolve to, with what the team holds in each."""
    if tree is None or team.slug not in tree.units:
        return []
    models = spec.models() or fleet_model_names()
    buckets = sorted({tree.bucket(team.slug, m) for m in models} - {None})
    held = quota.held(team.pk)
    lines = []
    for bucket in buckets:
        q = tree.quota(team.slug, bucket)
        use = [u for (_, model, admission), u in held.items()
               if admission in COUNTED and tree.bucket(team.slug, model) == bucket]
        total = sum(use, quota.NO_USAGE)
        lines.append(QuotaLine(bucket, Decimal(q.milli) / 1000, total.gpu_share, q.memory_mib, total.memory_mib,
                               q.gpus, total.gpus))
    return lines


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
