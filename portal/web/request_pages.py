"""The request page: the team's presets first, then the custom form in human units with a live
feasibility preview (server-rendered, debounced by htmx)."""

from __future__ import annotations

from datetime import UTC

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.fleet.model_names import fleet_models
from portal.reservations import rules, services
from portal.reservations.engine_quotas import NeverFits
from portal.tenancy.models import Preset
from portal.tenancy.policy import max_priority_for, request_problems

from . import preview as previews
from .forms import LOCAL_MINUTE, RequestForm, in_words, initial_from, initial_from_preset, submit_teams
from .views import visible_reservation


def _models() -> list[str]:
    return sorted(fleet_models())


def _presets(user) -> list[Preset]:
    return list(Preset.objects.filter(team__in=submit_teams(user)).select_related("team").order_by("team__slug",
                                                                                                   "name"))


def _submit(request, form: RequestForm):
    """Submit (or book) a valid form; returns the reservation (a booking's first), or None with the
    errors on the form (and, for a window that does not fit, `form.free_windows`)."""
    spec = form.spec()
    try:
        window = form.window()
    except rules.RuleViolation as exc:
        form.add_rule_errors(exc.errors)
        return None
    if window is not None:
        try:
            return services.book(request.user, spec, window)[0]
        except rules.RuleViolation as exc:
            form.add_rule_errors(exc.errors)
        except NeverFits as exc:
            form.add_error(None, in_words(str(exc)).capitalize() + ".")
        except services.BookingConflict as exc:
            text = in_words(str(exc))  # names a model and "UTC": only the first letter raised
            form.add_error(None, text[:1].upper() + text[1:] + ".")
            form.free_windows = exc.free_windows
        return None
    problems = request_problems(request.user, spec.team, priority=spec.priority, max_duration_s=spec.max_duration_s,
                                remote_allowed=spec.remote_allowed)
    if problems:
        form.add_rule_errors(problems)
        return None
    try:
        return services.submit(request.user, spec)
    except rules.RuleViolation as exc:
        form.add_rule_errors(exc.errors)
    except NeverFits as exc:
        form.add_error(None, in_words(str(exc)).capitalize() + ".")
    return None


@login_required
def new_reservation(request):
    initial = {}
    if request.htmx and request.GET.get("team"):
        # The team changed: the same values, with that team's labels and limits as the choices.
        initial = {k: v for k, v in request.GET.items() if k in RequestForm.base_fields}
    elif request.GET.get("again"):
        initial = initial_from(visible_reservation(request, _int(request.GET["again"])))
    elif request.GET.get("preset"):
        initial = initial_from_preset(_visible_preset(request, _int(request.GET["preset"])))
    form = RequestForm(request.POST or None, initial=initial, user=request.user, models=_models())
    if request.method == "POST" and form.is_valid():
        reservation = _submit(request, form)
        if reservation is not None:
            if reservation.starts_at is not None:
                messages.success(request, f"Reservation {reservation.pk} booked for {window_text(reservation)}.")
            else:
                messages.success(request, f"Reservation {reservation.pk} submitted.")
            return redirect("reservation", pk=reservation.pk)
    advanced_open = any(form[name].errors or (form.is_bound and form.data.get(name)) for name in form.ADVANCED
                        if name != "priority") or bool(form["priority"].errors)
    booking_open = any(form[name].errors or (form.is_bound and form.data.get(name) not in (None, "", "1"))
                       for name in form.BOOKING) or bool(request.GET.get("book"))
    return render(request, "web/request.html", {
        "form": form, "presets": _presets(request.user), "advanced_open": advanced_open,
        "booking_open": booking_open, "free_windows": [
            {"start": s.strftime(LOCAL_MINUTE), "end": e.strftime(LOCAL_MINUTE), "text": window_words(s, e)}
            for s, e in getattr(form, "free_windows", [])],
        "again": request.GET.get("again"), "from_preset": request.GET.get("preset"),
    }, status=400 if form.is_bound and form.errors else 200)


def _booking_preview(form: RequestForm, spec) -> dict | None:
    """For a start in the booking part: whether that window fits the bookings made so far."""
    try:
        window = form.window()
    except rules.RuleViolation as exc:
        return {"problem": "; ".join(in_words(m) for problems in exc.errors.values() for m in problems)}
    if window is None:
        return None
    if len(spec.models()) != 1:
        return {"problem": "a booking names one GPU model: choose one"}
    start, end = window.occurrences()[0]
    conflict = services.window_conflict(spec.team, spec, start, end)
    return {"when": window_words(start, end), "weeks": window.weeks, "conflict": conflict and in_words(conflict)}


def window_words(start, end) -> str:
    """"Tue 1 Dec 09:00–11:00 UTC", for a button or a list."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    until = f"{end:%H:%M}" if start.date() == end.date() else f"{end:%a} {end.day} {end:%b %H:%M}"
    return f"{start:%a} {start.day} {start:%b %H:%M}–{until} UTC"


def window_text(reservation) -> str:
    return window_words(reservation.starts_at, reservation.ends_at)


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise Http404("not found") from None


def _visible_preset(request, pk: int) -> Preset:
    preset = Preset.objects.filter(pk=pk, team__in=submit_teams(request.user)).select_related("team").first()
    if preset is None:
        raise Http404("no such preset")
    return preset


@login_required
@require_POST
def request_preset(request, pk: int):
    """Submit a preset as it is (one click from the preset's card)."""
    preset = _visible_preset(request, pk)
    spec = rules.ReservationSpec(
        team=preset.team, image=preset.image, gpu_request=preset.gpu_request, gpu_limit=preset.gpu_limit,
        gpu_memory_mib=preset.gpu_memory_mib, gpu_model=preset.gpu_model, kind=preset.kind,
        command=list(preset.command or []), max_duration_s=preset.max_duration_s, name="",
        app=preset.app, app_port=preset.app_port,
        priority=min(50, max_priority_for(request.user, preset.team)),  # the form's default, within the role's
    )
    try:
        reservation = services.submit(request.user, spec)
    except rules.RuleViolation as exc:
        messages.error(request, f"Preset {preset.name} cannot be requested now: " + "; ".join(
            in_words(m) for problems in exc.errors.values() for m in problems) + ".")
    except NeverFits as exc:
        messages.error(request, f"Preset {preset.name} can never run as asked: {in_words(str(exc))}.")
    else:
        messages.success(request, f"Reservation {reservation.pk} submitted from preset {preset.name}.")
        return redirect("reservation", pk=reservation.pk)
    return redirect("new-reservation")


@login_required
@require_GET
def request_preview(request):
    """The preview fragment for the form's current values (GET: it changes nothing)."""
    form = RequestForm(request.GET, user=request.user, models=_models())
    context = {"form": form, "preview": None}
    if form.is_valid():
        spec = form.spec()
        try:
            rules.check(spec)
        except rules.RuleViolation as exc:
            form.add_rule_errors(exc.errors)
        else:
            context["preview"] = previews.preview(spec)
            context["spec"] = spec
            context["booking"] = _booking_preview(form, spec)
    return render(request, "web/_request_preview.html", context)
