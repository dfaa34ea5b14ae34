"""What a planned drain does to bookings, worded here and handed to the fleet's writer: planning a
drain of a node is checked, under the same per-model lock as booking, against every booking of the
node's GPU models over its window; one that would no longer fit refuses the plan (409 naming the
bookings) unless the site admin forces it, and then their owners are told (the `booking_drained`
signal: notifications). Fleet sits below reservations and never imports them."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction

from portal.audit import services as audit
from portal.fleet import drain_plans
from portal.fleet import services as fleet_services
from portal.fleet.models import Node, PlannedDrain

from . import booking_fit
from .events import announce_bookings_drained
from .models import Reservation
from .services.booking import HORIZON, lock_model, outages_of, read_capacity

# An open-ended drain is judged over every booking that can exist (they start ≤ 90 days ahead and
# last ≤ 30 days).
OPEN_END = HORIZON + timedelta(days=31)


class DrainBreaksBookings(Exception):
    """A planned drain would take capacity that bookings were promised."""

    def __init__(self, message: str, bookings: list[Reservation]):
        super().__init__(message)
        self.bookings = bookings


def plan_drain(node: Node, by: audit.Actor, window: drain_plans.Window, force: bool = False
               ) -> tuple[PlannedDrain, list[Reservation]]:
    """Plan the node's drain for `window` (drain_plans.window_of checked it). Returns the plan and
    the bookings it breaks (only with `force`; their owners are told after commit). Raises
    DrainBreaksBookings without `force`, RuleViolation for a plan overlapping another of the node."""
    models = sorted(set(node.gpus.values_list("model", flat=True)))
    with transaction.atomic():
        for model in models:  # the order every booking takes them in: one model at a time
            lock_model(model)
        broken = _broken(node, window, models)
        if broken and not force:
            raise DrainBreaksBookings(
                f"Draining {node.name} {drain_plans.window_text(window.starts_at, window.ends_at)} takes capacity "
                f"promised to {len(broken)} booking(s): {'; '.join(_booking_words(r) for r in broken)}. Plan "
                "another window, or plan it anyway: their owners are told and their bookings may not get their "
                "capacity", broken)
        plan = fleet_services.plan_drain(node.pk, by, window, bookings=[
            {"id": r.pk, "team": r.team.slug, "owner": r.owner.get_username(),
             "window": booking_fit.window_text(r.starts_at, r.ends_at)} for r in broken])
        if broken:
            announce_bookings_drained([r.pk for r in broken], plan.pk,
                                      drain_plans.describe(plan, node.name))
    return plan, broken


def _broken(node: Node, window: drain_plans.Window, models: list[str]) -> list[Reservation]:
    end = window.ends_at or window.starts_at + OPEN_END
    new = booking_fit.Outage(node.name, window.starts_at, window.ends_at, "")
    ids: list[int] = []
    for model in models:
        cards, booked = read_capacity(model, window.starts_at, end)
        if not any(c.node == node.name for c in cards):
            continue  # its GPUs are counted out already (drained by hand, lost, cordoned)
        ids += [b.id for b in booking_fit.broken_by(cards, booked, outages_of(model, window.starts_at, end),
                                                    new, end)]
    return list(Reservation.objects.filter(pk__in=ids).select_related("team", "owner").order_by("starts_at", "pk"))


def _booking_words(r: Reservation) -> str:
    return f"#{r.pk} of team {r.team.slug} ({r.owner.get_username()}) for " \
           f"{booking_fit.window_text(r.starts_at, r.ends_at)}"
