"""Home after sign-in: my reservations as live cards, my teams' quota, free capacity by model.

The same views answer the whole page and, for htmx or the live script, the fragment that changed
(a reservation's card, the side panel). Every fragment checks tenancy like the page: another
team's reservation is 404."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal.reservations.models import Reservation

from . import queries


def visible_reservation(request, pk: int, placement: bool = False) -> Reservation:
    """The reservation if the signed-in user may see it, else 404 (never 403: no hint it exists)."""
    qs = Reservation.objects.visible_to(request.user).filter(pk=pk)
    reservation = (queries.with_placement(qs) if placement else qs.select_related("team", "node", "owner")).first()
    if reservation is None:
        raise Http404("no such reservation")
    return reservation


@login_required
@require_GET
def home(request):
    active, ended = queries.my_reservations(request.user)
    quotas = queries.team_quotas(request.user)
    return render(request, "web/home.html", {
        "active": active, "ended": ended, "quotas": quotas, "capacity": queries.free_capacity(),
        "live_groups": ",".join(f"team:{q.team.pk}" for q in quotas),
    })


@login_required
@require_GET
def reservation_card(request, pk: int):
    """One reservation's card (home). With ?mine=1, 204 for someone else's: the home page lists
    only its user's own, though the team's group tells it about all of the team's."""
    reservation = visible_reservation(request, pk, placement=True)
    if request.GET.get("mine") and reservation.owner_id != request.user.pk:
        return HttpResponse(status=204)
    return render(request, "web/_reservation_card.html", {"r": reservation})


@login_required
@require_GET
def home_side(request):
    return render(request, "web/_home_side.html", {
        "quotas": queries.team_quotas(request.user), "capacity": queries.free_capacity()})
