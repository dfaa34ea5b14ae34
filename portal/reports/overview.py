"""The overview: the fleet now (allocation and utilization, GPUs free, partly allocated and
stranded, who waits and why) and over a window (allocated versus used by team, queueing delay).

The GPU counts are the fleet's state (the capacity API shows the same to every user); every
allocation, use and waiting figure is only of the teams the user may see.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from portal.fleet.models import Gpu, NodeStatus, awaiting_approval
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import State
from portal.telemetry import hours
from portal.telemetry.models import RollupState
from portal.tenancy.models import Team

from . import bookings as booking_hours
from . import services
from .window import Window

# "Now" is the mean over the last few rolled-up minutes: one minute alone is noisy.
NOW_MINUTES = 5
EPS = 1e-6
WAITING_SHOWN = 10


@dataclass(frozen=True)
class _Shape:
    """What a waiting request needs of one GPU (multi-GPU requests take whole, free cards)."""

    share: float
    memory_mib: int
    models: frozenset[str]
    exclusion: str

    def fits(self, model: str, free_share: float, free_mib: int, labels: set[str]) -> bool:
        return (self.share <= free_share + EPS and self.memory_mib <= free_mib
                and (not self.models or model in self.models) and labels <= {self.exclusion})


def why_waiting(reason: str) -> str:
    """The placement's waiting reason, in one of the classes managers ask about."""
    text = reason.lower()
    if "quota" in text:
        return "quota"
    if "exclusion" in text:
        return "exclusion"
    if not text or "next placement cycle" in text:
        return "not yet considered"
    return "no fit"


def now(team_ids: list[int]) -> dict:
    # A GPU nobody has approved is no capacity: not counted free, nor in any model's total.
    gpus = list(Gpu.objects.filter(healthy=True).exclude(node__status=NodeStatus.LOST).exclude(awaiting_approval())
                .values_list("pk", "model", "memory_mib"))
    live = defaultdict(lambda: [0.0, 0, set(), 0.0])  # gpu → [share, memory, exclusion labels, our share]
    ours = set(team_ids)
    for gpu_id, share, mib, label, team_id in (Allocation.objects.filter(released_at__isnull=True)
                                               .values_list("gpu_id", "gpu_request", "gpu_memory_mib",
                                                            "reservation__exclusion", "reservation__team_id")):
        g = live[gpu_id]
        g[0] += float(share)
        g[1] += mib
        g[2].add(label)
        if team_id in ours:
            g[3] += float(share)

    shapes = {_Shape(float(r), m, frozenset(x for x in model.split("|") if x), excl)
              for r, m, model, excl, count in Reservation.objects.filter(state=State.PENDING)
              .values_list("gpu_request", "gpu_memory_mib", "gpu_model", "exclusion", "gpu_count") if count == 1}
    anyone_waits = Reservation.objects.filter(state=State.PENDING).exists()
    states = {"free": 0, "partly_allocated": 0, "stranded": 0, "full": 0}
    by_model: dict[str, dict] = defaultdict(lambda: {"gpus": 0, "allocated": 0.0})
    for gpu_id, model, memory in gpus:
        share, mib, labels, our_share = live.get(gpu_id, (0.0, 0, set(), 0.0))
        by_model[model]["gpus"] += 1
        by_model[model]["allocated"] += our_share
        free_share, free_mib = 1.0 - share, memory - mib
        if share <= EPS:
            states["free"] += 1
        elif free_share <= EPS:
            states["full"] += 1
        # Compute left over, yet no request can use it: its memory is all taken, or nothing that
        # waits fits in what is left (share, memory, model, exclusion group).
        elif free_mib <= 0 or (anyone_waits and not any(s.fits(model, free_share, free_mib, labels) for s in shapes)):
            states["stranded"] += 1
        else:
            states["partly_allocated"] += 1

    used = _used_now(team_ids)
    models = []
    for model in sorted(by_model):
        m = by_model[model]
        u, held = used.get(model, (0.0, 0.0))
        models.append({"model": model, "gpus": m["gpus"], "allocated_gpus": round(m["allocated"], 3),
                       "allocation_pct": _pct(m["allocated"], m["gpus"]),
                       "used_gpus": round(u, 3), "utilization_pct": _pct(u, held)})
    total_gpus = sum(m["gpus"] for m in by_model.values())
    allocated = sum(m["allocated"] for m in by_model.values())
    used_total, held_total = sum(u for u, _ in used.values()), sum(h for _, h in used.values())
    return {"gpus": total_gpus, "allocated_gpus": round(allocated, 3), "allocation_pct": _pct(allocated, total_gpus),
            "used_gpus": round(used_total, 3), "utilization_pct": _pct(used_total, held_total),
            "by_model": models, "gpu_states": states}


def _used_now(team_ids: list[int]) -> dict[str, tuple[float, float]]:
    """GPU model → (GPUs' worth used, GPUs' worth allocated) by these teams' shares, both the mean of
    the last rolled-up minutes over the same share-minutes: utilization is used ÷ allocated over
    one window (allocated now would leave out shares that ended in it and overstate it)."""
    end = RollupState.objects.values_list("rolled_up_to", flat=True).first()
    if end is None:
        return {}
    start = end - timedelta(minutes=NOW_MINUTES)
    sums = hours.share_minute_sums()
    rows = (hours.share_minutes(start, end).filter(team_id__in=team_ids).values("gpu__model")
            .annotate(t_used=sums["used"], t_held=hours.share_minute_allocated()))
    return {r["gpu__model"]: ((r["t_used"] or 0.0) / NOW_MINUTES, (r["t_held"] or 0.0) / NOW_MINUTES) for r in rows}


def waiting(team_ids: list[int]) -> dict:
    at = timezone.now()
    pending = list(Reservation.objects.filter(state=State.PENDING, team_id__in=team_ids).order_by("created_at", "id")
                   .values_list("pk", "name", "owner__username", "team__slug", "created_at", "state_reason",
                                "gpu_request", "gpu_count"))
    reasons: dict[str, int] = defaultdict(int)
    for row in pending:
        reasons[why_waiting(row[5])] += 1
    oldest = [{"reservation": pk, "name": name or f"#{pk}", "owner": owner, "team": team,
               "waiting_since": created, "waiting_s": int((at - created).total_seconds()),
               "why": why_waiting(reason), "reason": reason, "gpus": float(req) * count}
              for pk, name, owner, team, created, reason, req, count in pending[:WAITING_SHOWN]]
    return {"count": len(pending), "oldest_wait_s": oldest[0]["waiting_s"] if oldest else None,
            "by_reason": dict(sorted(reasons.items())), "oldest": oldest}


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (PostgreSQL's percentile_cont)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def queueing(window: Window, teams: list[Team]) -> list[dict]:
    """Per team: how long requests placed in the window waited from submission to placement."""
    waits: dict[int, list[float]] = defaultdict(list)
    for team_id, created, placed in (Reservation.objects.filter(team__in=teams, placed_at__gte=window.since,
                                                                 placed_at__lt=window.until)
                                     .values_list("team_id", "created_at", "placed_at")):
        waits[team_id].append(max(0.0, (placed - created).total_seconds()))
    out = []
    for t in teams:
        w = waits.get(t.pk, [])
        out.append({"team": t.slug, "placed": len(w), "p50_wait_s": _round(percentile(w, 0.5)),
                    "p90_wait_s": _round(percentile(w, 0.9))})
    return out


def overview(user, window: Window, teams: list[Team]) -> dict:
    team_ids = [t.pk for t in teams]
    report = services.usage(user, "team", window, teams)
    return {"since": window.since, "until": window.until, "time_zone": str(window.tz),
            "teams": [t.slug for t in teams], "now": now(team_ids), "waiting": waiting(team_ids),
            "series": report.series, "total": report.total.as_dict(), "queueing": queueing(window, teams),
            "bookings": booking_hours.totals(report.bookings)}


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 1) if whole > EPS else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)

