"""The bookings calendar (/bookings/): what is booked over the next weeks, per GPU model (site
admins: the fleet; managers: the teams they manage), the bookings of one's teams and one's own,
with cancel, move and delete; and each user's secret iCal feed of their bookings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import PermissionDenied

from portal.api.permissions import require_cancel
from portal.reservations import booking_calendar, calendar_feed, rules, services
from portal.reservations.states import IllegalTransition, State

from . import navigation
from .forms import LOCAL_MINUTE, in_words
from .request_pages import window_text, window_words
from .views import visible_reservation

WEEKS = 4
FEED_PAST = timedelta(days=30)
FEED_AHEAD = timedelta(days=92)
NEW_FEED = "bookings-new-feed"  # the session key that carries a new feed URL to the next page, once

navigation.register("Bookings", "bookings", order=25)


def _today() -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@login_required
@require_GET
def bookings_page(request):
    start = _today()
    end = start + timedelta(weeks=WEEKS)
    rows = list(booking_calendar.bookings_of(request.user, start, end))
    overview = booking_calendar.sees_fleet(request.user)
    models = booking_calendar.load_by_model(rows) if overview else []
    token = request.session.pop(NEW_FEED, None)
    return render(request, "web/bookings.html", {
        "start": start, "end": end, "overview": overview, "models": models,
        "days": booking_calendar.by_day(rows, models, start, WEEKS * 7) if overview else [],
        "drains": booking_calendar.drain_dips(start, end) if overview else [],
        "mine": [_row(r) for r in rows if r.owner_id == request.user.pk],
        "teams": [_row(r) for r in rows],
        "has_feed": calendar_feed.has_feed(request.user),
        "feed_url": request.build_absolute_uri(reverse("bookings-feed", args=[token])) if token else "",
    })


def _row(r) -> dict:
    return {"r": r, "when": window_text(r), "start": r.starts_at.astimezone(UTC).strftime(LOCAL_MINUTE),
            "end": r.ends_at.astimezone(UTC).strftime(LOCAL_MINUTE), "booked": r.state == State.BOOKED}


def _acting_on(request, pk: int):
    reservation = visible_reservation(request, pk)
    if reservation.starts_at is None:
        raise Http404("not a booking")
    require_cancel(request.user, reservation)  # the owner, a team admin or a site admin
    return reservation


def _act(request, pk: int, action) -> HttpResponse:
    try:
        reservation = _acting_on(request, pk)
        action(reservation)
    except PermissionDenied as exc:
        messages.error(request, str(exc.detail).capitalize() + ".")
    except IllegalTransition as exc:
        messages.error(request, f"Booking {pk} is {exc.current} now: it can no longer be changed here.")
    except rules.RuleViolation as exc:
        messages.error(request, f"Booking {pk} was not moved: " + "; ".join(
            in_words(m) for problems in exc.errors.values() for m in problems) + ".")
    except services.BookingConflict as exc:
        free = ", ".join(window_words(s, e) for s, e in exc.free_windows)
        messages.error(request, f"Booking {pk} was not moved: {in_words(str(exc))}."
                       + (f" Free nearby: {free}." if free else ""))
    return redirect("bookings")


@login_required
@require_POST
def cancel_booking(request, pk: int):
    def cancel(reservation):
        services.cancel_booking(reservation.pk, request.user)
        messages.success(request, f"Booking {pk} cancelled" + (
            "; the rest of its window is free for others." if reservation.state != State.BOOKED else "."))

    return _act(request, pk, cancel)


@login_required
@require_POST
def delete_booking(request, pk: int):
    def delete(reservation):
        if reservation.state != State.BOOKED:
            raise IllegalTransition(reservation.state, State.CANCELLED)
        gone = services.delete_series(reservation.pk, request.user)
        messages.success(request, f"Booking deleted ({len(gone)} window{'s' if len(gone) != 1 else ''}).")

    return _act(request, pk, delete)


@login_required
@require_POST
def move_booking(request, pk: int):
    def move(reservation):
        start, end = _when(request.POST.get("start")), _when(request.POST.get("end"))
        if start is None or end is None:
            raise rules.RuleViolation({"starts_at": ["give the new start and end as YYYY-MM-DDTHH:MM (UTC)"]})
        moved = services.move_booking(reservation.pk, request.user, start, end)
        messages.success(request, f"Booking {pk} moved to {window_text(moved)}.")

    return _act(request, pk, move)


def _when(text: str | None) -> datetime | None:
    try:
        return datetime.strptime(text or "", LOCAL_MINUTE).replace(tzinfo=UTC)
    except ValueError:
        return None


@login_required
@require_POST
def regenerate_feed(request):
    request.session[NEW_FEED] = calendar_feed.regenerate(request.user)
    messages.success(request, "Your calendar feed has a new secret address; the old one no longer works.")
    return redirect("bookings")


@require_GET
def feed(request, token: str):
    """The user's bookings as iCalendar (no sign-in: the secret address is the key)."""
    from icalendar import Calendar, Event

    user = calendar_feed.user_of(token)
    if user is None:
        raise Http404("no such feed")
    now = datetime.now(UTC)
    rows = booking_calendar.bookings_of(user, now - FEED_PAST, now + FEED_AHEAD, mine=True)
    calendar = Calendar()
    calendar.add("prodid", "-//Tessera//GPU bookings//EN")
    calendar.add("version", "2.0")
    calendar.add("x-wr-calname", "GPU bookings")
    host = request.get_host()
    for r in rows:
        event = Event()
        event.add("uid", f"reservation-{r.pk}@{host}")
        event.add("dtstamp", r.updated_at)
        event.add("dtstart", r.starts_at)
        event.add("dtend", r.ends_at)
        count = f"{r.gpu_count} × " if r.gpu_count > 1 else ""
        event.add("summary", f"{count}{r.gpu_request.normalize()} {r.gpu_model} ({r.team.slug})"
                  + (f": {r.name}" if r.name else ""))
        page = request.build_absolute_uri(reverse("reservation", args=[r.pk]))
        event.add("description", f"Reservation {r.pk}, {r.state}. {page}")
        calendar.add_component(event)
    response = HttpResponse(calendar.to_ical(), content_type="text/calendar; charset=utf-8")
    response["Cache-Control"] = "private, no-store"
    return response
