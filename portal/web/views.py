"""Server-rendered pages: sign in, request a GPU share, my reservations (with cancel)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from rest_framework.exceptions import PermissionDenied

from portal.api.permissions import require_cancel
from portal.reservations import rules, services
from portal.reservations.models import Reservation
from portal.reservations.quota import QuotaExceeded
from portal.reservations.states import IllegalTransition

from .forms import ReservationForm


@login_required
def reservations(request):
    qs = Reservation.objects.visible_to(request.user).select_related("team", "owner", "node")
    page = Paginator(qs, 25).get_page(request.GET.get("page"))
    return render(request, "web/reservations.html", {"page": page})


@login_required
def new_reservation(request):
    models = sorted(rules.fleet_models())
    form = ReservationForm(request.POST or None, user=request.user, models=models)
    if request.method == "POST" and form.is_valid():
        try:
            reservation = services.submit(request.user, rules.ReservationSpec(**form.spec_fields()))
        except rules.RuleViolation as exc:
            for field, problems in exc.errors.items():
                for problem in problems:
                    form.add_error(field if field in form.fields else None, problem)
        except QuotaExceeded as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Reservation {reservation.pk} submitted.")
            return redirect("home")
    return render(request, "web/new_reservation.html", {"form": form})


@login_required
@require_POST
def cancel_reservation(request, pk: int):
    reservation = Reservation.objects.visible_to(request.user).filter(pk=pk).first()
    if reservation is None:
        raise Http404("no such reservation")
    try:
        require_cancel(request.user, reservation)
        services.cancel(reservation.pk, request.user)
        messages.success(request, f"Reservation {pk} cancelled.")
    except IllegalTransition as exc:
        messages.error(request, f"Reservation {pk} cannot be cancelled: it is {exc.current}.")
    except PermissionDenied as exc:
        messages.error(request, str(exc.detail))
    return redirect("home")
