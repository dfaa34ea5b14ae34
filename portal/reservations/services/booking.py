"""Bookings: a reservation promised for a future window (`starts_at` .. `ends_at`), in state
`booked` until its start. Booking checks the window against its GPU model's cards and its team's
quota for that model, beside every booking already made (booking_fit); a window that does not fit
is refused, naming what is taken then, with the nearest free windows of the same length.

At its start a booking becomes pending (`start_due`, from a periodic task) and is placed like any
other request; a placed booking ends with its window (placing.ends_at). Early end is the normal
cancel or release, which frees the rest at once. A booking whose owner never shows up (no
process on its GPU for the team's `booking_no_show_min`) is released (`release_no_show`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from portal import db_vendor
from portal.fleet import drain_plans
from portal.fleet.model_names import fleet_model_names
from portal.reservations import actors, booking_fit, engine_quotas, rules
from portal.reservations.events import announce_reservations
from portal.reservations.models import Admission, Reservation
from portal.reservations.requests import request_of
from portal.reservations.states import ACTIVE, IllegalTransition, State
from portal.tenancy import policy
from portal.tenancy.models import Quota, Team

from .audit import record
from .moving import cancel, move, release

HORIZON = timedelta(days=90)  # the furthest ahead a window may start
STEP = timedelta(minutes=15)  # free windows are offered this far apart
MAX_REPEATS = 12  # weekly occurrences of one booking, the first included
FREE_WINDOWS = 3
MIN_LENGTH_S = 60
WEEK = timedelta(days=7)
# The start of every no-show's reason: reports count no-show hours by it.
NO_SHOW = "no-show"
# What holds capacity in a window: a booking, or the reservation it became until it ends.
TAKING = (State.BOOKED, *ACTIVE)


class BookingConflict(Exception):
    """A window that does not fit: what is taken then, and the nearest free windows."""

    def __init__(self, message: str, free_windows: list[tuple[datetime, datetime]]):
        super().__init__(message)
        self.free_windows = free_windows


@dataclass(frozen=True)
class Window:
    """A booking's window and how often it repeats weekly (1: once)."""

    starts_at: datetime
    ends_at: datetime
    weeks: int = 1

    def occurrences(self) -> list[tuple[datetime, datetime]]:
        return [(self.starts_at + i * WEEK, self.ends_at + i * WEEK) for i in range(self.weeks)]


def window_of(starts_at: datetime | None, ends_at: datetime | None = None, duration_s: int | None = None,
              weeks: int = 1, now: datetime | None = None) -> Window:
    """Check a window as the user gave it (a start, and an end or a length in seconds; weekly
    repeats); RuleViolation per field otherwise."""
    now = now or timezone.now()
    errors: dict[str, list[str]] = {}
    if starts_at is None:
        raise rules.RuleViolation({"starts_at": ["a booking needs a start"]})
    if timezone.is_naive(starts_at):
        errors["starts_at"] = ["must say its time zone (e.g. 2026-12-01T09:00:00Z)"]
    elif starts_at <= now:
        errors["starts_at"] = ["must be in the future"]
    elif starts_at > now + HORIZON:
        errors["starts_at"] = [f"must be at most {HORIZON.days} days ahead"]
    if (ends_at is None) == (duration_s is None):
        errors["ends_at"] = ["give either ends_at or duration_s"]
    elif ends_at is not None and timezone.is_naive(ends_at):
        errors["ends_at"] = ["must say its time zone (e.g. 2026-12-01T11:00:00Z)"]
    elif duration_s is not None and not (MIN_LENGTH_S <= duration_s <= 30 * 86400):
        errors["duration_s"] = ["must be between 60 seconds and 30 days"]
    if not 1 <= weeks <= MAX_REPEATS:
        errors["repeat_weeks"] = [f"a booking repeats weekly 1 to {MAX_REPEATS} times (1: once)"]
    if errors:
        raise rules.RuleViolation(errors)
    starts_at = starts_at.astimezone(UTC)
    end = ends_at.astimezone(UTC) if ends_at is not None else starts_at + timedelta(seconds=duration_s)
    length = (end - starts_at).total_seconds()
    if length < MIN_LENGTH_S:
        raise rules.RuleViolation({"ends_at": ["must be at least a minute after starts_at"]})
    if length > 30 * 86400:
        raise rules.RuleViolation({"ends_at": ["a booked window lasts at most 30 days"]})
    if starts_at + (weeks - 1) * WEEK > now + HORIZON:
        raise rules.RuleViolation({"repeat_weeks": [
            f"the last of {weeks} weekly windows would start more than {HORIZON.days} days ahead"]})
    return Window(starts_at, end, weeks)


def book(user, spec: rules.ReservationSpec, window: Window) -> list[Reservation]:
    """Book `spec` for `window` (and its weekly repeats): one `booked` reservation per occurrence,
    all or none. Raises RuleViolation (the request or the window), NeverFits (beyond a hard limit)
    or BookingConflict (an occurrence does not fit its model's cards or the team's quota)."""
    spec.max_duration_s = int((window.ends_at - window.starts_at).total_seconds())  # the window bounds the run
    rules.check(spec)
    model = _one_model(spec)
    with transaction.atomic():
        team = Team.objects.select_for_update(of=("self",)).select_related("policy").get(pk=spec.team.pk)
        problems = policy.request_problems(user, team, priority=spec.priority, max_duration_s=spec.max_duration_s,
                                           remote_allowed=spec.remote_allowed)
        if problems:
            if "max_duration_s" in problems:
                problems["ends_at"] = problems.pop("max_duration_s")
            raise rules.RuleViolation(problems)
        _refuse_never_fits(team, spec)
        lock_model(model)
        series = uuid.uuid4() if window.weeks > 1 else None
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "team"}
        made = []
        for start, end in window.occurrences():
            _check_fits(team, model, spec, start, end, exclude=None)
            reservation = Reservation.objects.create(
                owner=user, team=team, admission=Admission.GUARANTEED, state=State.BOOKED, starts_at=start,
                ends_at=end, booking_series=series,
                state_reason=f"booked for {booking_fit.window_text(start, end)}", **fields)
            record(reservation, "", State.BOOKED, user, f"booked for {booking_fit.window_text(start, end)}"
                   + (f" (week {len(made) + 1} of {window.weeks})" if series else ""))
            made.append(reservation)
        announce_reservations({r.pk: team.pk for r in made})
    return made


def move_booking(reservation_id: int, actor, starts_at: datetime, ends_at: datetime) -> Reservation:
    """Move a booking's window; the new one is checked as a new booking would be (beside every
    other booking, not itself). Raises RuleViolation, BookingConflict, or IllegalTransition for a
    reservation no longer booked."""
    window = window_of(starts_at, ends_at)
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update(of=("self",)).select_related("team").get(
            pk=reservation_id)
        if reservation.state != State.BOOKED:
            raise IllegalTransition(reservation.state, State.BOOKED)
        length = int((window.ends_at - window.starts_at).total_seconds())
        problems = policy.request_problems(actor, reservation.team, priority=None, max_duration_s=length)
        if problems:
            raise rules.RuleViolation({"ends_at": problems["max_duration_s"]})
        model = reservation.gpu_model
        lock_model(model)
        _check_fits(reservation.team, model, reservation, window.starts_at, window.ends_at, exclude=reservation.pk)
        before = booking_fit.window_text(reservation.starts_at, reservation.ends_at)
        after = booking_fit.window_text(window.starts_at, window.ends_at)
        reservation.starts_at, reservation.ends_at = window.starts_at, window.ends_at
        reservation.max_duration_s = length
        reservation.state_reason = f"booked for {after}"
        reservation.save(update_fields=["starts_at", "ends_at", "max_duration_s", "state_reason", "updated_at"])
        record(reservation, State.BOOKED, State.BOOKED, actor, f"booking moved from {before} to {after}")
        announce_reservations({reservation.pk: reservation.team_id})
    return reservation


def cancel_booking(reservation_id: int, actor) -> tuple[Reservation, bool]:
    """Cancel one booking; a booking that has started ends early, freeing the rest of its window
    at once (the normal cancel)."""
    return cancel(reservation_id, actor, "booking cancelled")


def delete_series(reservation_id: int, actor) -> list[int]:
    """Delete a booking and the rest of its weekly series: every occurrence still booked is
    cancelled, audited as deleted (the rows stay for their audit trail). Returns their ids."""
    reservation = Reservation.objects.get(pk=reservation_id)
    if reservation.booking_series is None:
        ids = [reservation.pk] if reservation.state == State.BOOKED else []
    else:
        ids = list(Reservation.objects.filter(booking_series=reservation.booking_series, state=State.BOOKED)
                   .order_by("starts_at").values_list("pk", flat=True))
    return [i for i in ids if move(i, State.BOOKED, State.CANCELLED, "booking deleted", actor)]


def free_windows(team: Team, terms, starts_at: datetime, ends_at: datetime, exclude: int | None = None,
                 count: int = FREE_WINDOWS) -> list[tuple[datetime, datetime]]:
    """The nearest windows of the same length (whole STEPs away, within the horizon) where these
    terms would fit their model and the team's quota."""
    model = terms.gpu_model
    now = timezone.now()
    cards, booked, quota, outages = _read(team, model, now, now + HORIZON + timedelta(days=31))
    new = _booked(exclude or 0, team.slug, terms, starts_at, ends_at)
    return booking_fit.free_windows(model, cards, quota, booked, new, earliest=_next_step(now),
                                    latest=now + HORIZON + (ends_at - starts_at), step=STEP, count=count,
                                    outages=outages)


def window_conflict(team: Team, terms, starts_at: datetime, ends_at: datetime) -> str | None:
    """What a booking of these terms for this window would meet now (the request page's preview;
    writes nothing, takes no lock: booking checks again), or None when it fits."""
    cards, booked, quota, outages = _read(team, terms.gpu_model, starts_at, ends_at)
    taken = booking_fit.conflict(terms.gpu_model, cards, quota, booked,
                                 _booked(0, team.slug, terms, starts_at, ends_at), outages)
    return None if taken is None else taken.message


def start_due(now: datetime | None = None) -> tuple[int, int]:
    """Bookings whose start has come become pending (placed as guaranteed by the next cycle); one
    whose whole window passed unstarted, and a booking-born reservation still waiting at its
    window's end, end without running. Returns (started, missed)."""
    now = now or timezone.now()
    started = missed = 0
    due = Reservation.objects.filter(state=State.BOOKED, starts_at__lte=now).order_by("starts_at")
    for pk, end in due.values_list("pk", "ends_at"):
        if end <= now:
            missed += move(pk, State.BOOKED, State.CANCELLED, "its booked window passed before it could start",
                           actors.LIFECYCLE)
        else:
            started += move(pk, State.BOOKED, State.PENDING,
                            f"its booked window started; guaranteed until {booking_fit.at_text(end)}",
                            actors.LIFECYCLE)
    late = Reservation.objects.filter(state=State.PENDING, starts_at__isnull=False, ends_at__lte=now)
    for pk in late.values_list("pk", flat=True):
        missed += move(pk, State.PENDING, State.EXPIRED, "its booked window ended before it was placed",
                       actors.LIFECYCLE)
    return started, missed


def release_no_show(reservation_id: int, minutes: int) -> bool:
    """A booking whose owner did not show up (no process on its GPU for its first `minutes`) is
    released at once, so others use its window; the reason says so."""
    return release(reservation_id, State.EXPIRED,
                   f"{NO_SHOW}: no process used its GPU in the first {minutes} min of its booked window; "
                   "released so others can use the rest of it")


def _one_model(spec: rules.ReservationSpec) -> str:
    models = spec.models()
    if len(models) == 1:
        return models[0]
    if not models:
        fleet = fleet_model_names()
        if len(fleet) == 1:
            spec.gpu_model = fleet[0]
            return fleet[0]
    raise rules.RuleViolation({"gpu_model": ["a booking names one GPU model: its capacity is promised on that model"]})


def _refuse_never_fits(team: Team, spec: rules.ReservationSpec) -> None:
    tree = engine_quotas.path_tree(team)
    problem = engine_quotas.never_fits(tree, request_of(spec, team.slug, "booking"), spec.models())
    if problem:
        raise engine_quotas.NeverFits(f"team {team.slug}: this request can never run as asked: {problem}", team)


def lock_model(model: str) -> None:
    """Bookings of one model are checked one at a time (the check reads every other booking of it)."""
    db_vendor.of(connection).lock_for_transaction(connection, f"booking:{model}")


def _check_fits(team: Team, model: str, terms, start: datetime, end: datetime, exclude: int | None) -> None:
    cards, booked, quota, outages = _read(team, model, start, end)
    new = _booked(exclude or 0, team.slug, terms, start, end)
    taken = booking_fit.conflict(model, cards, quota, booked, new, outages)
    if taken is None:
        return
    if booking_fit.conflict(model, cards, quota, [], new) is not None:
        raise BookingConflict(taken.message, [])  # beyond the quota or the cards alone: no window would do
    raise BookingConflict(taken.message, free_windows(team, terms, start, end, exclude))


def _next_step(now: datetime) -> datetime:
    """The first quarter hour after `now` (free windows start on the quarter hour)."""
    base = now.replace(minute=0, second=0, microsecond=0)
    return base + STEP * (int((now - base) / STEP) + 1)


def _booked(pk: int, team: str, terms, start: datetime, end: datetime) -> booking_fit.Booked:
    return booking_fit.Booked(pk, team, start, end, int(Decimal(terms.gpu_request) * 1000), terms.gpu_memory_mib,
                              terms.gpu_count)


def _read(team: Team, model: str, start: datetime, end: datetime
          ) -> tuple[list[booking_fit.Card], list[booking_fit.Booked], booking_fit.TeamQuota, list[booking_fit.Outage]]:
    """The model's cards bookings may count on, the bookings of the model overlapping [start, end),
    the team's quota for the model and the drains planned on its nodes over the span."""
    cards, booked = read_capacity(model, start, end)
    return cards, booked, team_quota(team, model), outages_of(model, start, end)


def read_capacity(model: str, start: datetime, end: datetime
                  ) -> tuple[list[booking_fit.Card], list[booking_fit.Booked]]:
    """The model's cards bookings may count on (drain_plans.bookable_gpus) and its bookings (and the
    reservations they became) overlapping [start, end)."""
    cards = [booking_fit.Card(node, memory) for node, memory in
             drain_plans.bookable_gpus(model).order_by().values_list("node__name", "memory_mib")]
    rows = (Reservation.objects.filter(gpu_model=model, state__in=TAKING, starts_at__lt=end, ends_at__gt=start)
            .order_by().values_list("pk", "team__slug", "starts_at", "ends_at", "gpu_request", "gpu_memory_mib",
                                    "gpu_count"))
    booked = [booking_fit.Booked(pk, slug, s, e, int(share * 1000), memory, count)
              for pk, slug, s, e, share, memory, count in rows]
    return cards, booked


def outages_of(model: str, start: datetime, end: datetime, exclude: int | None = None) -> list[booking_fit.Outage]:
    """The drains planned over [start, end) on nodes with GPUs of `model`, as the check counts them."""
    return [booking_fit.Outage(name, d.starts_at, d.ends_at, drain_plans.describe(d, name))
            for d, name in drain_plans.of_model(model, start, end) if d.pk != exclude]


def team_quota(team: Team, model: str) -> booking_fit.TeamQuota:
    """The team's own quota row for the model, else its `*` row; none: nothing may be booked."""
    rows = {q.gpu_model: q for q in Quota.objects.filter(Q(gpu_model=model) | Q(gpu_model="*"), team=team)}
    q = rows.get(model) or rows.get("*")
    if q is None:
        return booking_fit.TeamQuota(0, 0, 0)
    return booking_fit.TeamQuota(int(q.gpu_share * 1000), int(q.gpu_memory_gib * 1024), q.gpus)


def series_of(reservation: Reservation) -> Sequence[Reservation]:
    """The occurrences of a booking's weekly series still booked, first first (itself alone when
    it has none)."""
    if reservation.booking_series is None:
        return [reservation]
    return list(Reservation.objects.filter(booking_series=reservation.booking_series, state=State.BOOKED)
                .order_by("starts_at"))
