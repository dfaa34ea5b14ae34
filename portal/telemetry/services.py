"""Telemetry questions other parts of the portal ask: measured use per reservation, the
placements an agent must enforce, and the newest readings for the live views and /metrics."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Max, OuterRef, Q, Sum
from django.utils import timezone

from portal import db_vendor
from portal.placement.share_tokens import EXPIRY_SLACK_S
from portal.reservations.models import Allocation, Sharing
from portal.reservations.states import ACTIVE, TERMINAL
from scheduler.backends.base import broker_priority
from wire.agent_portal import MAX_REVOKED_SHARES, POD_UID_PATTERN, PROTOCOL_VERSION, Placements, RevokedShares

from .models import GpuSample, RollupState, ShareMinute, ShareSample

# Newest readings older than this are not "current" (the agent is away): /metrics and the live
# state leave such GPUs out rather than show stale numbers as live.
CURRENT_WITHIN = timedelta(seconds=30)
_POD_UID = re.compile(POD_UID_PATTERN)


def recent_utilization(reservation_ids: Iterable[int], since: datetime) -> dict[int, float]:
    """Measured GPU use of each reservation since `since`: the mean over time of the fraction of
    a GPU its shares really used, summed over its GPUs (0.3 = on average 30 % of one GPU).

    Reservations with no samples in the window are absent from the answer: no data (no agent,
    or not started) is not the same as idle. Raw samples cover the recent part; per-minute
    rollups the part before the last rollup, so a window longer than raw retention works too.
    """
    ids = list({int(i) for i in reservation_ids})
    if not ids:
        return {}
    state = RollupState.objects.first()
    rolled_to = state.rolled_up_to if state else None
    sums: dict[tuple[int, int], list[float]] = {}  # (reservation, gpu) → [sum, count]
    raw_from = since
    if rolled_to is not None and rolled_to > since:
        minutes = (ShareMinute.objects.filter(reservation_id__in=ids, minute__gte=since, minute__lt=rolled_to)
                   .values("reservation_id", "gpu_id").annotate(s=Sum("used_sum"), n=Sum("samples")))
        for row in minutes:
            sums[(row["reservation_id"], row["gpu_id"])] = [row["s"] or 0.0, row["n"] or 0]
        # Raw rows of rolled-up minutes would count twice; the minute of `since` itself may be
        # partial, which is the price of minute granularity.
        raw_from = max(since, rolled_to)
    raw = (ShareSample.objects.filter(reservation_id__in=ids, ts__gte=raw_from)
           .values("reservation_id", "gpu_id").annotate(s=Sum("used_frac"), n=Count("id")))
    for row in raw:
        entry = sums.setdefault((row["reservation_id"], row["gpu_id"]), [0.0, 0])
        entry[0] += row["s"] or 0.0
        entry[1] += row["n"]
    result: dict[int, float] = {}
    for (reservation_id, _gpu), (total, count) in sums.items():
        if count:
            result[reservation_id] = result.get(reservation_id, 0.0) + total / count
    return {k: round(v, 4) for k, v in result.items()}


def placements_for_node(node_id: int, priorities: bool = False) -> Placements:
    """The `placements` message for a node's agent: every live share on its GPUs (with
    `priorities`, each share's broker class, for agents that asked for it in their hello)."""
    rows = (Allocation.objects.filter(gpu__node_id=node_id, released_at__isnull=True)
            .select_related("gpu").order_by("reservation_id", "gpu__index")
            .values_list("reservation_id", "gpu__uuid", "gpu_request", "gpu_limit", "gpu_memory_mib",
                         "reservation__pod_uid", "reservation__priority"))
    placements = [
        {"reservation": str(reservation), "gpu_uuid": gpu_uuid, "request": float(share),
         "limit": float(max(limit, share)), "memory_mib": memory or None,
         # The pod lets the agent attribute processes; only a Kubernetes UID is worth sending.
         "pod_uid": pod_uid if pod_uid and _POD_UID.fullmatch(pod_uid) else None,
         **({"priority": broker_priority(priority)} if priorities else {})}
        for reservation, gpu_uuid, share, limit, memory, pod_uid, priority in rows
    ]
    # Milliseconds keep the revision increasing across portal restarts and processes.
    return Placements(v=PROTOCOL_VERSION, type="placements", revision=time.time_ns() // 1_000_000,
                      placements=placements)


def revoked_shares_for_node(node_id: int) -> RevokedShares:
    """The `revoked_shares` message for a GPU node's agent (PROTOCOL.md 5.5): the shares that
    left its GPUs within the longest a share token outlives its release (TESSERA_REMOTE_TOKEN_TTL_S
    + the tokens' slack; a token issued with an end time expires earlier), newest first, each with
    the placement attempt from which its tokens stay valid. Those that ended as remote shares, and
    those put back in the queue (preempted and requeued, a lost node) or that ended after more than
    one placement: their `sharing` says how they were placed last, not how they were here, and the
    token of their old pod must stop working here too. A share held nowhere here now has every token
    void (its attempt so far + 1); one placed here again keeps its entry with its current attempt,
    so that its new token works and its old one does not. One query: the attempt and where the
    share is are read together."""
    since = timezone.now() - timedelta(seconds=settings.TESSERA_REMOTE_TOKEN_TTL_S + EXPIRY_SLACK_S)
    here_now = Allocation.objects.filter(reservation_id=OuterRef("reservation_id"), gpu__node_id=node_id,
                                         released_at__isnull=True)
    rows = (Allocation.objects.filter(gpu__node_id=node_id, released_at__gte=since)
            .filter(Q(reservation__sharing=Sharing.REMOTE, reservation__state__in=TERMINAL)
                    # placed more than once: an earlier placement may have been remote here
                    | Q(reservation__attempt__gt=1, reservation__state__in=TERMINAL)
                    | Q(reservation__state__in=ACTIVE))
            .values("reservation_id", "reservation__attempt")
            .annotate(at=Max("released_at"), here=Exists(here_now)).order_by("-at", "-reservation_id")
            .values_list("reservation_id", "at", "reservation__attempt", "here")[:MAX_REVOKED_SHARES])
    shares = [{"share": str(reservation), "at": int(at.timestamp()),
               "from_attempt": max(1, attempt) if here else attempt + 1}
              for reservation, at, attempt, here in rows]
    return RevokedShares(v=PROTOCOL_VERSION, type="revoked_shares", shares=shares)


def latest_gpu_readings(gpu_ids: Iterable[int] | None = None) -> dict[int, dict]:
    """gpu id → its newest raw reading within CURRENT_WITHIN."""
    qs = GpuSample.objects.filter(ts__gte=timezone.now() - CURRENT_WITHIN)
    if gpu_ids is not None:
        qs = qs.filter(gpu_id__in=list(gpu_ids))
    fields = ("gpu_id", "ts", "sm_util_pct", "mem_util_pct", "mem_used_mib", "power_w", "temp_c")
    rows = db_vendor.of(connection).newest_per(qs, ["gpu_id"], "ts", fields)
    return {r["gpu_id"]: _reading(r) for r in rows}


def _reading(row: dict) -> dict:
    return {"gpu": row["gpu_id"], "ts_ms": int(row["ts"].timestamp() * 1000), "sm_util_pct": row["sm_util_pct"],
            "mem_util_pct": row["mem_util_pct"], "mem_used_mib": row["mem_used_mib"],
            "power_w": row["power_w"], "temp_c": row["temp_c"]}


def latest_share_readings(reservation_ids: Iterable[int] | None = None) -> dict[tuple[int, int], dict]:
    """(reservation id, gpu id) → newest share reading within CURRENT_WITHIN, with the team."""
    qs = ShareSample.objects.filter(ts__gte=timezone.now() - CURRENT_WITHIN)
    if reservation_ids is not None:
        qs = qs.filter(reservation_id__in=list(reservation_ids))
    fields = ("reservation_id", "gpu_id", "ts", "used_frac", "mem_used_mib", "reservation__team_id")
    rows = db_vendor.of(connection).newest_per(qs, ["reservation_id", "gpu_id"], "ts", fields)
    return {
        (r["reservation_id"], r["gpu_id"]): {
            "reservation": r["reservation_id"], "team": r["reservation__team_id"], "gpu": r["gpu_id"],
            "ts_ms": int(r["ts"].timestamp() * 1000), "used_frac": round(r["used_frac"], 4),
            "mem_used_mib": r["mem_used_mib"]}
        for r in rows
    }
