"""Planned drains as others read them: the checks a site admin's plan must pass (the window and the
reason, in the admin's words), the plans that take some GPUs of a model out of a span (bookings
count them out: reservations.booking_fit), and the GPUs bookings may count on. Written only by
fleet.services (plan_drain, cancel_drain, apply_due_drains)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from portal.errors import RuleViolation

from .models import OPEN_DRAINS, DrainState, Gpu, NodeStatus, PlannedDrain

HORIZON = timedelta(days=90)  # as far ahead as a booking may start
LONGEST = timedelta(days=30)
SHORTEST = timedelta(minutes=1)
# A start this far in the past still means "now" (the form's clock and the server's differ a little).
NOW_SLACK = timedelta(minutes=5)
REASON_MAX = 200


@dataclass(frozen=True)
class Window:
    starts_at: datetime
    ends_at: datetime | None
    reason: str


def window_of(starts_at: datetime | None, ends_at: datetime | None, reason: str, now: datetime | None = None
              ) -> Window:
    """Check a plan as the admin gave it; RuleViolation per field otherwise. A start a little in the
    past is now; no end: open-ended (the node stays drained until a person returns it)."""
    now = now or timezone.now()
    errors: dict[str, list[str]] = {}
    reason = " ".join((reason or "").split())  # one line, as the node's status shows it
    if not reason:
        errors["reason"] = ["say why (the reason is shown on the node, the calendar and to booking owners)"]
    elif len(reason) > REASON_MAX:
        errors["reason"] = [f"the reason is {len(reason)} characters long; keep it to {REASON_MAX}"]
    if starts_at is None:
        errors["starts_at"] = ["a planned drain needs a start (now or later)"]
    elif timezone.is_naive(starts_at):
        errors["starts_at"] = ["must say its time zone (e.g. 2026-12-01T09:00:00Z)"]
    elif starts_at < now - NOW_SLACK:
        errors["starts_at"] = ["must be now or in the future"]
    elif starts_at > now + HORIZON:
        errors["starts_at"] = [f"must be at most {HORIZON.days} days ahead"]
    if ends_at is not None and timezone.is_naive(ends_at):
        errors["ends_at"] = ["must say its time zone (e.g. 2026-12-01T11:00:00Z)"]
    if errors:
        raise RuleViolation(errors)
    start = max(starts_at, now).astimezone(UTC)
    end = ends_at.astimezone(UTC) if ends_at is not None else None
    if end is not None:
        if end - start < SHORTEST:
            raise RuleViolation({"ends_at": ["must be at least a minute after the start"]})
        if end - start > LONGEST:
            raise RuleViolation({"ends_at": [f"a planned drain lasts at most {LONGEST.days} days; leave the end "
                                             "empty for one that lasts until a person returns the node"]})
    return Window(start, end, reason)


def window_text(start: datetime, end: datetime | None) -> str:
    """'2026-12-01 09:00–11:00 UTC', or 'from 2026-12-01 09:00 UTC on' when open-ended."""
    start = start.astimezone(UTC)
    if end is None:
        return f"from {start:%Y-%m-%d %H:%M} UTC on"
    end = end.astimezone(UTC)
    end_text = f"{end:%H:%M}" if start.date() == end.date() else f"{end:%Y-%m-%d %H:%M}"
    return f"{start:%Y-%m-%d %H:%M}–{end_text} UTC"


def describe(drain: PlannedDrain, node_name: str) -> str:
    """'node a100-1 is drained for maintenance 2026-12-01 09:00–11:00 UTC (new PSU, plan #4)'."""
    return f"node {node_name} is drained for maintenance {window_text(drain.starts_at, drain.ends_at)} " \
           f"({drain.reason}, plan #{drain.pk})"


def overlapping(start: datetime, end: datetime) -> QuerySet[PlannedDrain]:
    """Open plans (planned or draining now) whose window meets [start, end)."""
    return PlannedDrain.objects.filter(Q(ends_at__isnull=True) | Q(ends_at__gt=start), state__in=OPEN_DRAINS,
                                       starts_at__lt=end)


def of_model(model: str, start: datetime, end: datetime) -> list[tuple[PlannedDrain, str]]:
    """(plan, node name) of the open plans over [start, end) on nodes with GPUs of `model`."""
    rows = (overlapping(start, end).filter(node__gpus__model=model).distinct().select_related("node")
            .order_by("starts_at", "pk"))
    return [(d, d.node.name) for d in rows]


def bookable_gpus(model: str) -> QuerySet[Gpu]:
    """The model's GPUs bookings may count on: not cordoned, on ready nodes, and on nodes a planned
    drain with an end holds now (they come back at its end; the plan counts them out until then).
    A node drained by a person, or lost, counts none: nobody knows when it returns."""
    returning = PlannedDrain.objects.filter(node=OuterRef("node"), state=DrainState.ACTIVE, applied=True,
                                            ends_at__isnull=False)
    return Gpu.objects.filter(model=model, cordoned=False).filter(
        Q(node__status=NodeStatus.READY) | Q(Exists(returning), node__status=NodeStatus.DRAINING))
