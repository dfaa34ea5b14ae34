"""Notes on reservations that change no state: why one still waits and where it stands in the
queue, that one sits idle, that one was warned of its end."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from portal.bulk import update_rows
from portal.reservations.events import announce_reservations
from portal.reservations.models import Reservation
from portal.reservations.states import HOLDS_GPU, State

NO_ESTIMATE = "; no estimate: "  # what follows in a waiting reservation's reason says why it has no estimate


def base_reason(text: str) -> str:
    """A waiting reservation's reason without its note on the estimate (the cycle's own words)."""
    return text.split(NO_ESTIMATE, 1)[0]


def note_estimate_reasons(notes: Iterable[tuple[int, str, str]]) -> int:
    """(reservation id, its reason now, why it has no estimated start or "") for waiting
    reservations: the reason keeps the cycle's words and says why there is no estimate; only
    those that change are written. Returns how many."""
    rows = []
    for pk, reason, why in notes:
        text = (base_reason(reason) + (NO_ESTIMATE + why if why else ""))[:500]
        if text != reason:
            rows.append(Reservation(pk=pk, state_reason=text))
    written = update_rows(rows, ["state_reason"])
    if written:
        announce_reservations(dict(Reservation.objects.filter(pk__in=[r.pk for r in rows])
                                   .values_list("pk", "team_id")))
    return written


def note_pending_reason(reservation_id: int, reason: str) -> None:
    """Store why a pending reservation is not placed yet (shown by the API as state_reason)."""
    rows = Reservation.objects.filter(pk=reservation_id, state=State.PENDING)
    if rows.update(state_reason=reason[:500]):
        announce_reservations(dict(rows.values_list("pk", "team_id")))


def set_queue_positions(positions: Iterable[tuple[int, int, datetime | None]]) -> int:
    """(reservation id, place in the queue, estimated start) for waiting reservations whose
    numbers changed; then clear the numbers of those that left the queue another way (cancelled,
    failed). Returns the rows written."""
    rows = [Reservation(pk=pk, queue_position=position, estimated_start=start) for pk, position, start in positions]
    written = update_rows(rows, ["queue_position", "estimated_start"])
    if written:  # browsers watching them see the new place in the queue
        announce_reservations(dict(Reservation.objects.filter(pk__in=[r.pk for r in rows])
                                   .values_list("pk", "team_id")))
    return written + Reservation.objects.filter(queue_position__isnull=False).exclude(state=State.PENDING).update(
        queue_position=None, estimated_start=None)


def flag_idle(reservation_id: int, idle: bool, now: datetime) -> bool:
    """Mark a running reservation idle since `now` (kept if already idle): its owner is warned, and
    its page says when it is reclaimed (idle_reclaim_at). Or not idle any more. Returns whether the
    mark changed; a change is announced to the browsers that watch the reservation."""
    rows = Reservation.objects.filter(pk=reservation_id, state=State.RUNNING)
    if idle:
        changed = bool(rows.filter(idle_since__isnull=True).update(idle_since=now))
    else:
        changed = bool(rows.filter(idle_since__isnull=False).update(idle_since=None))
    if changed:
        announce_reservations(dict(rows.values_list("pk", "team_id")))
    return changed


def idle_reclaim_at(idle_since: datetime | None, team) -> datetime | None:
    """When a reservation idle since `idle_since` is reclaimed if it stays idle: the team's
    warning period after the warning (the flag). None: not idle, or the team only warns."""
    if idle_since is None or not team.idle_reclaim:
        return None
    return idle_since + timedelta(seconds=team.idle_warning_s)


def warn_expiry(reservation_id: int, now: datetime) -> bool:
    """Note that the owner was warned of the coming end (once per end time: an extension clears
    it). Returns whether this call was the one that warned."""
    return bool(Reservation.objects.filter(pk=reservation_id, state__in=HOLDS_GPU, expiry_warned_at__isnull=True)
                .update(expiry_warned_at=now))
