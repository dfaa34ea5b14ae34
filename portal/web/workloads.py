"""The workloads page (`/workloads/`): the reservations of the teams a manager, team admin or site
admin looks after (the teams whose reports they see, portal.reports.scope), filtered, sorted,
paged, exported as CSV, and cancelled or extended where the role allows.

The same query serves the page, its htmx fragment, the CSV and `GET /api/v1/workloads/`, so the
four agree. Cancel and extend go through the reservation services with the same permission check
as the reservation page (portal.api.permissions.require_cancel: team admins and owners, never
managers); a reservation outside the user's teams is 404.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F, Prefetch, Q, QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.dateparse import parse_date
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import PermissionDenied as ApiPermissionDenied

from portal.api.permissions import require_cancel
from portal.dates import day_problem
from portal.fleet.model_names import fleet_model_names
from portal.reports import csv_export, scope
from portal.reservations import services
from portal.reservations.models import Allocation, Reservation
from portal.reservations.states import ACTIVE, IllegalTransition, State
from portal.tenancy import roles

from . import navigation
from .forms import ExtendForm

PAGE_SIZE = 50
CSV_MAX_ROWS = 100_000  # a year of a busy site; beyond it the export says to narrow the filters
PARAMS = {"team", "user", "state", "gpu_model", "since", "until", "sort", "page"}

# Sortable columns: the key in `?sort=` (a leading "-" reverses) and the field ordered by.
SORTS = {"id": "id", "team": "team__slug", "user": "owner__username", "name": "name", "state": "state",
         "gpu_model": "gpu_model", "share": "gpu_request", "memory": "gpu_memory_mib", "node": "node__name",
         "created": "created_at", "started": "started_at", "ended": "finished_at"}
DEFAULT_SORT = "-created"

CSV_HEADER = ["id", "team", "user", "name", "state", "GPU model", "share (% of a GPU)", "memory (GiB per GPU)",
              "node", "GPU", "created (UTC)", "started (UTC)", "ended (UTC)"]


class WorkloadQuery(forms.Form):
    team = forms.SlugField(required=False, max_length=50)
    user = forms.CharField(required=False, max_length=150)
    state = forms.ChoiceField(required=False, choices=[("", "all"), ("active", "active (pending, placed, running)"),
                                                       *State.choices])
    gpu_model = forms.CharField(required=False, max_length=64)
    since = forms.CharField(required=False, max_length=40)
    until = forms.CharField(required=False, max_length=40)
    sort = forms.ChoiceField(required=False, choices=[(p + k, p + k) for k in SORTS for p in ("", "-")])
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000,
                              error_messages={"invalid": "the page is a whole number, 1 or more"})

    def clean_since(self) -> date | None:
        return _day(self.cleaned_data["since"])

    def clean_until(self) -> date | None:
        return _day(self.cleaned_data["until"])

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            # Both dates stay in the form (the page shows what was typed): only the answer is refused.
            self.add_error("until", f"the end date {until.isoformat()} is before the start date "
                                    f"{since.isoformat()}; swap them or pick another")
        return data


def _day(text: str) -> date | None:
    if not text:
        return None
    try:
        day = parse_date(text)
    except ValueError:
        day = None
    if day is None:
        raise forms.ValidationError(f"'{text}' is not a date such as 2026-11-16")
    problem = day_problem(day)
    if problem:
        raise forms.ValidationError(problem)
    return day


def teams_of(user) -> QuerySet:
    """The teams whose workloads `user` sees: the ones whose reports they see (403 for others)."""
    if not scope.may_see_reports(user):
        raise PermissionDenied("the workloads page is for team managers, team admins and site admins")
    return scope.report_teams(user)


def workloads(user, q: dict) -> QuerySet[Reservation]:
    """The reservations matching a valid query, sorted; a team filter outside `user`'s teams is 404.

    The time range keeps reservations that existed at some moment of it: made before its end, and
    not ended before its start. Dates are days in the portal's time zone, both included."""
    teams = teams_of(user)
    if q.get("team"):
        teams = teams.filter(slug=q["team"])
        if not teams.exists():
            raise Http404("no such team")
    qs = Reservation.objects.filter(team__in=teams)
    if q.get("user"):
        qs = qs.filter(owner__username=q["user"])
    if q.get("state") == "active":
        qs = qs.filter(state__in=ACTIVE)
    elif q.get("state"):
        qs = qs.filter(state=q["state"])
    if q.get("gpu_model"):
        model = q["gpu_model"]
        on_model = Allocation.objects.filter(gpu__model__iexact=model).values("reservation_id")
        qs = qs.filter(Q(id__in=on_model) | Q(gpu_model__icontains=model))
    tz = ZoneInfo(settings.TIME_ZONE)
    if q.get("since"):
        qs = qs.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=datetime.combine(q["since"], time(0), tz)))
    if q.get("until"):
        qs = qs.filter(created_at__lt=datetime.combine(q["until"] + timedelta(days=1), time(0), tz))
    sort = q.get("sort") or DEFAULT_SORT
    field = F(SORTS[sort.lstrip("-")])
    order = field.desc(nulls_last=True) if sort.startswith("-") else field.asc(nulls_last=True)
    allocations = Allocation.objects.select_related("gpu__node").order_by("gpu__node__name", "gpu__index")
    return (qs.select_related("team", "owner", "node").prefetch_related(Prefetch("allocations", allocations))
            .order_by(order, "-id"))


@dataclass(frozen=True)
class Row:
    """One reservation as the page, the CSV and the API show it."""

    id: int
    team: str
    user: str
    name: str
    state: str
    gpu_model: str
    share_pct: float
    memory_gib: float
    node: str
    gpus: list[str]
    created: datetime
    started: datetime | None
    ended: datetime | None
    active: bool


def row(r: Reservation) -> Row:
    # The GPUs it holds or held (by node and index, not UUID); their models, else the one requested.
    gpus = list(dict.fromkeys(f"{a.gpu.node.name}/{a.gpu.index}" for a in r.allocations.all()))
    models = list(dict.fromkeys(a.gpu.model for a in r.allocations.all()))
    return Row(id=r.pk, team=r.team.slug, user=r.owner.username, name=r.name, state=r.state,
               gpu_model=", ".join(models) or r.gpu_model.replace("|", " or ") or "any",
               share_pct=float(r.gpu_request * 100), memory_gib=round(r.gpu_memory_mib / 1024, 2),
               node=r.node.name if r.node else "", gpus=gpus, created=r.created_at, started=r.started_at,
               ended=r.finished_at, active=r.state in ACTIVE)


def csv_table(rows) -> tuple[list[str], list[list]]:
    def when(at: datetime | None) -> str:
        return at.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%SZ") if at else ""

    return CSV_HEADER, [[x.id, x.team, x.user, x.name, x.state, x.gpu_model, x.share_pct, x.memory_gib, x.node,
                         " ".join(x.gpus), when(x.created), when(x.started), when(x.ended)] for x in rows]


def problems(form: WorkloadQuery) -> dict[str, str]:
    return {name: " ".join(str(e) for e in errs) for name, errs in form.errors.items()}


@login_required
@require_GET
def workloads_page(request):
    user_teams = list(teams_of(request.user).order_by("slug"))
    form = WorkloadQuery(request.GET)
    valid = form.is_valid()
    q = form.cleaned_data if valid else {}
    qs = workloads(request.user, q) if valid else Reservation.objects.none()
    if valid and request.GET.get("format") == "csv":
        found = list(qs[:CSV_MAX_ROWS + 1])
        if len(found) > CSV_MAX_ROWS:
            return HttpResponse(f"More than {CSV_MAX_ROWS} reservations match: narrow the filters or the dates.",
                                status=400, content_type="text/plain; charset=utf-8")
        header, rows = csv_table(row(r) for r in found)
        response = HttpResponse(csv_export.to_csv(header, rows), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="workloads.csv"'
        return response
    page = Paginator(qs, PAGE_SIZE).get_page(q.get("page") or 1)
    raw = {k: request.GET.get(k, "") for k in PARAMS}  # what was typed, shown back even when refused
    kept = {k: v for k, v in raw.items() if v and k != "page"}
    # The sort asked for stays in force while another filter is refused (the next answer uses it).
    sort = q.get("sort") or (raw["sort"] if raw["sort"].lstrip("-") in SORTS else DEFAULT_SORT)
    may_act = {t.pk for t in user_teams if request.user.is_staff or roles.can_admin(request.user, t.pk)}
    context = {
        "rows": [(row(r), r.team_id in may_act) for r in page.object_list], "page": page, "filters": raw,
        "errors": problems(form), "teams": user_teams, "states": form.fields["state"].choices,
        "models": fleet_model_names(), "query": urlencode(kept), "sort": sort,
        "columns": _columns(kept, sort), "extend_form": ExtendForm(),
        "csv_url": "?" + urlencode({**{k: v for k, v in kept.items() if k != "sort"}, "sort": sort, "format": "csv"}),
        "back": "?" + request.GET.urlencode() if request.GET else "",
    }
    context["prev_url"] = "?" + urlencode({**kept, "page": page.number - 1}) if page.has_previous() else ""
    context["next_url"] = "?" + urlencode({**kept, "page": page.number + 1}) if page.has_next() else ""
    partial = request.htmx and not request.htmx.history_restore_request
    # A refused filter is 400, but htmx swaps only 2xx answers: its fragment, which says what is
    # wrong in place of the table, comes as 200 so the person sees it.
    response = render(request, "web/_workloads_table.html" if partial else "web/workloads.html", context,
                      status=200 if valid or partial else 400)
    response["Vary"] = "HX-Request"
    return response


def _columns(kept: dict, sort: str) -> list[tuple[str, str, str]]:
    """Each sortable column's label, the link that sorts by it (again: reversed), and aria-sort."""
    labels = [("id", "Id"), ("team", "Team"), ("user", "User"), ("name", "Name"), ("state", "State"),
              ("gpu_model", "GPU model"), ("share", "Share"), ("memory", "Memory"), ("node", "Node"),
              ("created", "Created"), ("started", "Started"), ("ended", "Ended")]
    out = []
    for key, label in labels:
        now = "ascending" if sort == key else "descending" if sort == "-" + key else ""
        wanted = "-" + key if sort == key else key
        out.append((label, "?" + urlencode({**kept, "sort": wanted}), now))
    return out


def _reservation_in_scope(request, pk: int) -> Reservation:
    """The reservation if it belongs to one of the user's workload teams, else 404."""
    reservation = Reservation.objects.filter(pk=pk, team__in=teams_of(request.user)).first()
    if reservation is None:
        raise Http404("no such reservation")
    return reservation


def _back(request):
    """Back to the page with the filters it was posted from (only a query string is taken)."""
    back = request.POST.get("back", "")
    return redirect(reverse("workloads") + (back if back.startswith("?") else ""))


@login_required
@require_POST
def cancel_workload(request, pk: int):
    reservation = _reservation_in_scope(request, pk)
    try:
        require_cancel(request.user, reservation)
        services.cancel(reservation.pk, request.user, reason=f"cancelled by {request.user.username} (workloads)")
    except ApiPermissionDenied:
        raise PermissionDenied(f"only a team admin may cancel reservation {pk}") from None
    except IllegalTransition as exc:
        messages.error(request, f"Reservation {pk} cannot be cancelled: it is {exc.current}.")
    else:
        messages.success(request, f"Reservation {pk} cancelled.")
    return _back(request)


@login_required
@require_POST
def extend_workload(request, pk: int):
    reservation = _reservation_in_scope(request, pk)
    form = ExtendForm(request.POST)
    try:
        require_cancel(request.user, reservation)
    except ApiPermissionDenied:
        raise PermissionDenied(f"only a team admin may extend reservation {pk}") from None
    if not form.is_valid():
        for error in form.errors.get("hours", []) + form.non_field_errors():
            messages.error(request, f"Reservation {pk}: {error}")
        return _back(request)
    hours: Decimal = form.cleaned_data["hours"]
    try:
        services.extend(reservation.pk, request.user, int(hours * 3600))
    except services.ExtendRefused as exc:
        messages.error(request, f"Reservation {pk} was not extended: {exc}.")
    else:
        messages.success(request, f"Reservation {pk} extended by {hours.normalize():f} h.")
    return _back(request)


navigation.register("Workloads", "workloads", allowed=navigation.manager, order=45)
