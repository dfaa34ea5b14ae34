"""Idle reservations: flagged (the owner warned) when their measured use stays under the team's
threshold for the team's time, and ended when the team reclaims idle ones and the team's warning
period has passed with the reservation still idle."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.utils import timezone

from portal.reservations import actors, services
from portal.reservations.models import Reservation
from portal.reservations.states import State
from scheduler.backends import Backend

from .pods import delete_quietly

Measure = Callable[[list[int], datetime], dict[int, float]]


def measured_utilization(reservation_ids: list[int], since: datetime) -> dict[int, float]:
    """Measured GPU use per reservation (fraction of one GPU, summed over its GPUs); absent = no data."""
    from portal.telemetry.services import recent_utilization

    return recent_utilization(reservation_ids, since)


def check_idle(backend: Backend, measure: Measure = measured_utilization) -> tuple[int, int]:
    """Flag reservations whose measured use stayed under their team's threshold for the team's
    time; end them at a check at least the team's warning period after the flag, still idle, when
    the team reclaims idle ones. Returns (flagged, reclaimed)."""
    now = timezone.now()
    flagged = reclaimed = 0
    running = list(Reservation.objects.filter(state=State.RUNNING, started_at__isnull=False).select_related("team"))
    by_window: dict[int, list[Reservation]] = {}
    for r in running:
        if r.team.idle_after_s and r.started_at <= now - timedelta(seconds=r.team.idle_after_s):
            by_window.setdefault(r.team.idle_after_s, []).append(r)
    for seconds, group in by_window.items():
        used = measure([r.pk for r in group], now - timedelta(seconds=seconds))
        for r in group:
            if r.pk not in used:
                continue  # no measurements is not idleness
            per_gpu = used[r.pk] / max(1, r.gpu_count)
            if per_gpu >= float(r.team.idle_threshold):
                services.flag_idle(r.pk, False, now)
                continue
            newly = services.flag_idle(r.pk, True, now)
            flagged += newly
            # Warn, then reclaim: the check that finds it idle flags it (the owner is warned, and
            # sees when the reclaim comes: services.idle_reclaim_at); a check at least the team's
            # warning period later that still finds it idle ends it. Used meanwhile: the flag goes,
            # and so does the warning.
            reclaim_at = None if newly else services.idle_reclaim_at(r.idle_since, r.team)
            if reclaim_at is not None and reclaim_at <= now:
                why = (f"reclaimed: used {per_gpu:.1%} of its GPU over the last {seconds // 60} min, under "
                       f"team {r.team.slug}'s idle threshold of {float(r.team.idle_threshold):.1%}, and still idle "
                       f"{r.team.idle_warning_s // 60} min after the warning")
                if services.move(r.pk, State.RUNNING, State.EXPIRED, why, actors.LIFECYCLE):
                    reclaimed += 1
                    delete_quietly(backend, r.pod_namespace, r.pod_name, "reclaimed while idle")
    return flagged, reclaimed
