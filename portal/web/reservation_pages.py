"""One reservation's page (/reservations/<id>/): header, state timeline, usage charts, the pod's
log, connection details, extend, cancel, request again. Fragments: the summary (header, timeline,
actions) and the log. All of them 404 for a reservation of another team."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import PermissionDenied

from portal.api.permissions import require_cancel
from portal.placement.backend import get_backend
from portal.reservations import services
from portal.reservations.states import ACTIVE, HOLDS_GPU, IllegalTransition
from portal.tenancy import roles
from portal.tenancy.policy import policy_of
from scheduler.backends import BackendError, PodRef

from . import queries
from .forms import ExtendForm
from .views import visible_reservation

LOG_LINES = 200


def _may_cancel(user, reservation) -> bool:
    try:
        require_cancel(user, reservation)
    except PermissionDenied:
        return False
    return True


def _may_extend(user, reservation) -> bool:
    return reservation.state in ACTIVE and _may_cancel(user, reservation)


def _summary_context(request, reservation, extend_form=None) -> dict:
    return {
        "r": reservation,
        "timeline": queries.timeline(reservation),
        "may_cancel": reservation.state in ACTIVE and _may_cancel(request.user, reservation),
        "may_extend": _may_extend(request.user, reservation),
        "may_submit": roles.can_submit(request.user, reservation.team),
        "max_hours": policy_of(reservation.team).max_duration_s / 3600,
        "extend_form": extend_form or ExtendForm(),
        "holds_gpu": reservation.state in HOLDS_GPU,
    }


@login_required
@require_GET
def reservation_page(request, pk: int):
    reservation = visible_reservation(request, pk, placement=True)
    context = _summary_context(request, reservation)
    if request.htmx and request.GET.get("part") == "summary":
        return render(request, "web/_reservation_summary.html", context)
    context["series"] = queries.usage_series(reservation)
    return render(request, "web/reservation.html", context)


@login_required
@require_GET
def reservation_log(request, pk: int):
    reservation = visible_reservation(request, pk)
    text, problem = None, ""
    if not reservation.pod_name:
        problem = "No pod yet: the log appears once the reservation is placed."
    else:
        try:
            text = get_backend().pod_log(PodRef(reservation.pod_namespace, reservation.pod_name), LOG_LINES)
        except BackendError as exc:
            problem = f"The cluster did not give the log: {exc}"
        if text is None and not problem:
            problem = "The pod is gone (the reservation ended), and its log with it."
    return render(request, "web/_reservation_log.html", {"r": reservation, "log": text, "problem": problem,
                                                         "lines": LOG_LINES})


@login_required
@require_POST
def extend_reservation(request, pk: int):
    reservation = visible_reservation(request, pk, placement=True)
    form = ExtendForm(request.POST)
    if not _may_extend(request.user, reservation):
        form.is_valid()
        form.add_error(None, "Only its owner or a team admin can extend this reservation, and only while it is "
                             "active.")
    elif form.is_valid():
        hours = form.cleaned_data["hours"]
        try:
            reservation = services.extend(reservation.pk, request.user, int(hours * 3600))
        except services.ExtendRefused as exc:
            form.add_error("hours", str(exc)[0].upper() + str(exc)[1:] + ".")
        else:
            messages.success(request, f"Extended by {hours.normalize():f} h.")
            if not request.htmx:
                return redirect("reservation", pk=pk)
            reservation = visible_reservation(request, pk, placement=True)
            form = None
    if not request.htmx:
        for error in form.errors.get("hours", []) + form.non_field_errors():
            messages.error(request, error)
        return redirect("reservation", pk=pk)
    return render(request, "web/_reservation_summary.html", _summary_context(request, reservation, form))


@login_required
@require_POST
def cancel_reservation(request, pk: int):
    reservation = visible_reservation(request, pk)
    try:
        require_cancel(request.user, reservation)
        services.cancel(reservation.pk, request.user)
        messages.success(request, f"Reservation {pk} cancelled.")
    except IllegalTransition as exc:
        messages.error(request, f"Reservation {pk} cannot be cancelled: it is {exc.current}.")
    except PermissionDenied as exc:
        messages.error(request, str(exc.detail).capitalize() + ".")
    return redirect(request.POST.get("next") if request.POST.get("next") == "/" else f"/reservations/{pk}/")
