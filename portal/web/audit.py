"""The audit log page: every admin change (portal.audit, made through the browser or the API)
and every reservation transition, newest first, filterable by team, user, object and date.
Site admins read everything; team admins their own teams' entries; others are refused (403)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from portal.api.audit_views import audit_scope
from portal.audit import services as audit
from portal.audit.forms import AuditPageQuery
from portal.reservations.models import StateTransition
from portal.tenancy import roles
from portal.tenancy.models import Role

from . import navigation

PAGE = 50
OBJECT_TYPES = [("", "everything"), ("reservation", "reservations (transitions)"), ("membership", "memberships"),
                ("exclusion", "exclusion groups"), ("affinity", "affinity labels"), ("preset", "presets"),
                ("policy", "policies"), ("team", "teams and quotas"), ("node", "nodes"), ("gpu", "GPUs"),
                ("node_token", "node tokens")]


@dataclass(frozen=True)
class Line:
    at: datetime
    actor: str
    via: str
    team: str
    object_type: str
    object_label: str
    object_url: str
    action: str
    before: dict
    after: dict
    message: str


def _may_read(user) -> list[int] | None:
    """None: everything (site admins); else the ids of the teams whose entries the user reads."""
    if user.is_staff:
        return None
    admin_of = [t for t, r in roles.team_roles(user).items() if r == Role.ADMIN]
    if not admin_of:
        raise PermissionDenied("only site admins and team admins read the audit log")
    return admin_of


@login_required
def audit_page(request):
    scope = _may_read(request.user)
    params = request.GET
    query = AuditPageQuery({**params.dict(), "object_type": params.get("object", "")})
    valid = query.is_valid()
    errors = {name: " ".join(messages) for name, messages in query.problems().items()}
    q = query.cleaned_data if valid else {}
    team_choices = roles.visible_teams(request.user)
    if scope is not None:
        team_choices = team_choices.filter(id__in=scope)
    team_choices = list(team_choices.order_by("slug"))
    team = next((t for t in team_choices if t.slug == q.get("team")), None)
    username = q.get("user", "")
    object_type = q.get("object_type", "")
    if object_type not in dict(OBJECT_TYPES):
        object_type = ""
    object_id = q.get("object_id", "")
    lo, hi = audit.day_range(q.get("since"), q.get("until"))
    page = q.get("page") or 1
    want = page * PAGE + 1  # enough of each log to fill this page after merging, plus one to know of more

    changes = []
    if valid and object_type != "reservation":
        qs = audit.entries(team=team, object_type=object_type, object_id=object_id, since=lo, before=hi)
        if scope is not None:
            qs = qs.filter(pk__in=audit_scope(request.user).values("pk"))
        if username:
            qs = qs.filter(actor_label=username)
        changes = [Line(e.at, e.actor_label, e.get_via_display(), e.team.slug if e.team else "", e.object_type,
                        e.object_repr, "", e.action, e.before, e.after, e.message) for e in qs[:want]]
    transitions = []
    if valid and object_type in ("", "reservation"):
        ts = StateTransition.objects.select_related("reservation__team").order_by("-at", "-id")
        if scope is not None:
            ts = ts.filter(reservation__team_id__in=scope)
        if team is not None:
            ts = ts.filter(reservation__team=team)
        if username:
            ts = ts.filter(actor_label=username)
        if object_id:
            ts = ts.filter(reservation_id=object_id if object_id.isascii() and object_id.isdigit() else 0)
        if lo:
            ts = ts.filter(at__gte=lo)
        if hi:
            ts = ts.filter(at__lt=hi)
        transitions = [Line(t.at, t.actor_label, "", t.reservation.team.slug, "reservation",
                            f"reservation {t.reservation_id}", f"/reservations/{t.reservation_id}/",
                            "transition", {"state": t.from_state or "—"}, {"state": t.to_state}, t.reason)
                       for t in ts[:want]]
    merged = list(heapq.merge(changes, transitions, key=lambda line: line.at, reverse=True))
    lines = merged[(page - 1) * PAGE: page * PAGE]
    return render(request, "audit/audit.html", {
        "lines": lines, "page": page, "has_next": len(merged) > page * PAGE, "errors": errors,
        "teams": team_choices, "object_types": OBJECT_TYPES,
        "filters": {"team": team.slug if team else "", "user": username, "object": object_type,
                    "object_id": object_id, "since": params.get("since", ""), "until": params.get("until", "")},
    }, status=200 if valid else 400)


navigation.register("Audit log", "audit", allowed=navigation.team_admin, order=80)
