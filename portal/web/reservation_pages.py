"""One reservation's page (/reservations/<id>/): header, how it counts against quotas (guaranteed,
borrowed and its reclaim warning, opportunistic), its place in the queue and estimated start while
it waits, state timeline, usage charts, the pod's log, connection details, extend, cancel, request
again. Fragments: the summary (header, timeline,
actions) and the log. All of them 404 for a reservation of another team."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import PermissionDenied

from portal.api.permissions import require_cancel
from portal.connect.access import link_for as connect_link
from portal.placement.backend import get_backend
from portal.placement.pods import LOG_LINES
from portal.reservations import services
from portal.reservations.models import Admission, PodLog
from portal.reservations.states import ACTIVE, HOLDS_GPU, IllegalTransition, State
from portal.tenancy import roles
from portal.tenancy.policy import policy_of
from scheduler.backends import BackendError, PodRef

from . import queries
from .forms import ExtendForm
from .templatetags.tessera import human_duration
from .views import visible_reservation


def _may_cancel(user, reservation) -> bool:
    try:
        require_cancel(user, reservation)
    except PermissionDenied:
        return False
    return True


def _may_extend(user, reservation) -> bool:
    return reservation.state in ACTIVE and _may_cancel(user, reservation)


def counting(reservation, grace_s: int) -> dict:
    """How the reservation counts against quotas, in words: {"admission", "title", "text"}. A waiting
    one is decided when it is placed (its row says what it would be now)."""
    admission = str(reservation.admission)
    warning = human_duration(grace_s) + " warning" if grace_s else "no warning"
    if reservation.state == State.PENDING:
        opportunistic = ("; at priority 0, opportunistic on idle capacity (may be preempted)"
                         if reservation.priority == 0 else "")
        return {"admission": "", "title": "How it counts is decided when it starts",
                "text": f"Guaranteed within team {reservation.team.slug}'s quota; beyond it, borrowed from what "
                        f"others lend (may be reclaimed with {warning}){opportunistic}. Until one of them has "
                        "room, it waits."}
    if admission == Admission.BORROWED:
        return {"admission": admission, "title": f"Borrowed — may be reclaimed with {warning}",
                "text": f"It runs beyond team {reservation.team.slug}'s quota on capacity others lend now. When "
                        f"they need it back it is reclaimed: you get {warning} (the team's policy), its pod is told "
                        "to stop, then it is preempted."}
    if admission == Admission.OPPORTUNISTIC:
        return {"admission": admission, "title": "Opportunistic — may be preempted",
                "text": "Priority 0 on idle capacity, counted in no quota: any higher priority request may "
                        "preempt it at any time, without warning."}
    return {"admission": admission, "title": "Guaranteed",
            "text": f"Within team {reservation.team.slug}'s quota: it is not reclaimed for others."}


def _summary_context(request, reservation, extend_form=None) -> dict:
    team_policy = policy_of(reservation.team)
    return {
        "r": reservation,
        "counting": counting(reservation, team_policy.reclaim_grace_s),
        "being_reclaimed": reservation.reclaim_at is not None and reservation.state in HOLDS_GPU,
        "reclaim_due": reservation.reclaim_at is not None and reservation.reclaim_at <= timezone.now(),
        "timeline": queries.timeline(reservation),
        # A booking may be cancelled before its window too.
        "may_cancel": (reservation.state in ACTIVE or reservation.state == State.BOOKED)
        and _may_cancel(request.user, reservation),
        "may_extend": _may_extend(request.user, reservation),
        "may_submit": roles.can_submit(request.user, reservation.team),
        "max_hours": team_policy.max_duration_s / 3600,
        "extend_form": extend_form or ExtendForm(),
        "holds_gpu": reservation.state in HOLDS_GPU,
        "connect": connect_link(request.user, reservation),
    }


@login_required
@require_GET
def reservation_page(request, pk: int):
    reservation = visible_reservation(request, pk, placement=True)
    context = _summary_context(request, reservation)
    if request.htmx and request.GET.get("part") == "summary":
        return render(request, "web/_reservation_summary.html", context)
    if request.htmx and request.GET.get("part") == "connect":
        return render(request, "web/_connect.html", context)
    context["series"] = queries.usage_series(reservation)
    return render(request, "web/reservation.html", context)


@login_required
@require_GET
def reservation_log(request, pk: int):
    """The pod's log from the cluster while the pod exists; once it is deleted, the last lines kept
    just before (placement.pods.keep_log)."""
    reservation = visible_reservation(request, pk)
    text, problem, kept = None, "", None
    if reservation.pod_name:
        try:
            text = get_backend().pod_log(PodRef(reservation.pod_namespace, reservation.pod_name), LOG_LINES)
        except BackendError as exc:
            problem = f"The cluster did not give the log: {exc}"
    if text is None and not problem:
        kept = PodLog.objects.filter(reservation=reservation).first()
        if kept is not None:
            text = kept.text
        elif reservation.pod_name or reservation.started_at:
            problem = "The pod is gone (the reservation ended) and no log of it was kept."
        elif reservation.state in ACTIVE:
            problem = "No pod yet: the log appears once the reservation is placed."
        else:
            problem = "It ended before it had a pod: there is no log."
    return render(request, "web/_reservation_log.html", {"r": reservation, "log": text, "problem": problem,
                                                         "lines": LOG_LINES, "kept": kept})


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
