"""A node's planned drains (/fleet/nodes/<name>/drains/): the maintenance windows planned for it,
a form to plan one and a button to cancel one. Through reservations.drain_effects (the bookings a
plan would break: refused with their names until the admin ticks "plan it anyway") and
fleet.services. Site admins only."""

from __future__ import annotations

from datetime import UTC

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.fleet import drain_plans
from portal.fleet import services as fleet_services
from portal.fleet.models import OPEN_DRAINS, Node, PlannedDrain
from portal.reservations import drain_effects

from .fleet_admin import require_site_admin
from .forms import LOCAL_MINUTE

RECENT = 10  # ended and cancelled plans shown under the open ones


class DrainForm(forms.Form):
    starts_at = forms.DateTimeField(
        label="Starts (UTC)", input_formats=[LOCAL_MINUTE, "%Y-%m-%d %H:%M"],
        help_text="Now or later, up to 90 days ahead. The node is drained then: no new shares; running ones keep "
                  "running.", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=LOCAL_MINUTE))
    ends_at = forms.DateTimeField(
        required=False, label="Ends (UTC)", input_formats=[LOCAL_MINUTE, "%Y-%m-%d %H:%M"],
        help_text="The node takes new shares again then. Blank: until a person returns it.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=LOCAL_MINUTE))
    reason = forms.CharField(max_length=drain_plans.REASON_MAX, label="Reason",
                             help_text="Shown on the node, the bookings calendar and to booking owners.")
    force = forms.BooleanField(required=False, label="Plan it anyway: the bookings named above may not get their "
                                                    "capacity; their owners are told")


def _aware(value):
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


@login_required
def node_drains_page(request, name: str):
    require_site_admin(request)
    node = get_object_or_404(Node, name=name)
    form = DrainForm(request.POST or None)
    broken = []
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        try:
            window = drain_plans.window_of(_aware(d["starts_at"]), _aware(d["ends_at"]), d["reason"])
            plan, broken = drain_effects.plan_drain(node, audit.web(request.user), window, force=d["force"])
        except RuleViolation as exc:
            for field, problems in exc.errors.items():
                form.add_error(field if field in form.fields else None, problems)
        except drain_effects.DrainBreaksBookings as exc:
            broken = exc.bookings
            form.add_error(None, str(exc))
        else:
            when = drain_plans.window_text(plan.starts_at, plan.ends_at)
            messages.success(request, f"Drain of {node.name} planned {when}"
                             + (f"; the owners of {len(broken)} booking(s) were told." if broken else "."))
            return redirect("fleet-node-drains", name=node.name)
    plans = PlannedDrain.objects.filter(node=node)
    return render(request, "fleet/drains.html", {
        "node": node, "form": form, "broken": broken,
        "open": [(p, drain_plans.window_text(p.starts_at, p.ends_at)) for p in plans.filter(state__in=OPEN_DRAINS)],
        "recent": [(p, drain_plans.window_text(p.starts_at, p.ends_at))
                   for p in plans.exclude(state__in=OPEN_DRAINS).order_by("-starts_at", "-pk")[:RECENT]],
    }, status=400 if request.method == "POST" else 200)


@login_required
@require_POST
def node_drain_cancel(request, name: str, pk: int):
    require_site_admin(request)
    plan = get_object_or_404(PlannedDrain, pk=pk, node__name=name)
    plan = fleet_services.cancel_drain(plan.pk, audit.web(request.user))
    messages.success(request, f"The planned drain of {name} is {plan.state}: {plan.end_note}.")
    return redirect("fleet-node-drains", name=name)
