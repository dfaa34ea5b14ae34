"""The reports pages: the overview and the usage report. Both read the same services as the API
(`/api/v1/reports/...`), and link to its CSV with the same query, so page, JSON and CSV agree.

Only managers, team admins and site admins see them (403 for everyone else, as the API); a team
filter naming a team the user may not see answers 404, like any other team's object.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.utils.dateparse import parse_date
from django.utils.http import urlencode

from portal.web import navigation
from portal.web.templatetags.tessera import human_duration, team_class, team_colour

from . import bookings as booking_hours
from . import csv_export, fairshare, scope
from . import overview as overview_service
from .forms import ReportQuery
from .services import GROUPS, percent, usage
from .window import RANGES

navigation.register("Reports", "reports-overview", allowed=navigation.manager, order=50, section="/reports/")

GROUP_LABELS = {"team": "Team", "department": "Department", "user": "User", "node": "Node", "gpu_model": "GPU model",
                "gpu": "GPU", "reservation": "Reservation"}


def _teams(request, slug: str):
    if not scope.may_see_reports(request.user):
        raise PermissionDenied("reports are for team managers, team admins and site admins")
    visible = list(scope.report_teams(request.user).order_by("slug"))
    if slug:
        chosen = [t for t in visible if t.slug == slug]
        if not chosen:
            raise Http404("no such team")
        return visible, chosen
    return visible, visible


def _context(request, query: ReportQuery, page: str) -> dict:
    """What both pages show around their report: the filters and the range links."""
    q = query.cleaned_data if query.is_valid() else {}
    kept = {k: v for k, v in request.GET.items() if k in ("group_by", "team", "tz") and v}
    window = q.get("window")
    dates = {}
    if window is not None:
        last = window.until - timedelta(microseconds=1)
        dates = {"since_date": window.since.astimezone(window.tz).date().isoformat(),
                 "until_date": last.astimezone(window.tz).date().isoformat(),
                 "window_text": f"{_local(window.since, window.tz)} to {_local(window.until, window.tz)} ({window.tz})"}
    else:  # refused (a backwards range, a bad day): the days stay as typed, beside what is wrong with them
        dates = {"since_date": _typed_day(request.GET.get("since", "")),
                 "until_date": _typed_day(request.GET.get("until", ""))}
    return {
        **dates, "tz_name": request.GET.get("tz", "") or settings.TIME_ZONE,
        "query": query, "page": page,
        "ranges": [(name, f"?{urlencode({**kept, 'range': name})}",
                    request.GET.get("range") == name or (name == "7d" and not request.GET.get("range")
                                                        and not request.GET.get("since")))
                   for name in RANGES],
        "window": q.get("window"),
    }


def _typed_day(text: str) -> str:
    """The day a date field was given (a date, or a date-time's day), as a date input shows it."""
    try:
        return text[:10] if parse_date(text[:10]) else ""
    except ValueError:  # 2026-02-30
        return ""


def _local(at: datetime, tz) -> str:
    return at.astimezone(tz).strftime("%Y-%m-%d %H:%M")


def _csv_url(kind: str, request) -> str:
    params = {k: v for k, v in request.GET.items() if k in ("group_by", "range", "since", "until", "tz", "team") and v}
    return reverse(f"{kind}-report") + "?" + urlencode({**params, "format": "csv"})


def _series_chart(series: dict, tz, teams) -> dict:
    """The over-time chart's data for reports.js: allocated per team (stacked) and used in all."""
    edges = series["edges"]
    colours = {t.slug: team_colour(t) for t in teams}
    classes = {t.slug: team_class(t) for t in teams}
    names = {t.slug: t.name or t.slug for t in teams}
    slugs = [s for s, v in sorted(series["teams"].items()) if any(v["allocated"]) or any(v["used"])]
    used = [round(sum(series["teams"][s]["used"][i] for s in series["teams"]), 4) for i in range(len(edges) - 1)]
    return {
        "x": [int(e.timestamp()) for e in edges[:-1]],
        "labels": [e.astimezone(tz).strftime("%Y-%m-%d" if series["bucket_hours"] == 24 else "%m-%d %H:%M")
                   for e in edges[:-1]],
        "bucket_hours": series["bucket_hours"],
        "teams": [{"slug": s, "label": names.get(s, s), "colour": colours.get(s, "#0072B2"), "cls": classes.get(s, ""),
                   "allocated": series["teams"][s]["allocated"], "used": series["teams"][s]["used"]} for s in slugs],
        "used": used,
    }


def _pct_text(value) -> str:
    return "–" if value is None else f"{value:g} %"


def _share(part: float, whole: float) -> float | None:
    return percent(part, whole) if whole > 0 else None


def _of_allocated(pct, text: str) -> str:
    return text if pct is None else f"{text}: {pct:g} % of allocated"


def _rows_for_table(chart: dict) -> list[dict]:
    out = []
    for i, label in enumerate(chart["labels"]):
        allocated = [t["allocated"][i] for t in chart["teams"]]
        out.append({"label": label, "allocated": allocated, "total": round(sum(allocated), 4),
                    "used": chart["used"][i]})
    return out


@login_required
def usage_page(request):
    query = ReportQuery(request.GET)
    visible, teams = _teams(request, request.GET.get("team", ""))
    context = _context(request, query, "usage")
    context.update({"visible_teams": visible, "groups": [(g, GROUP_LABELS[g]) for g in GROUPS],
                    "csv_url": _csv_url("usage", request)})
    if query.is_valid():
        q = query.cleaned_data
        report = usage(request.user, q["group_by"], q["window"], teams)
        chart = _series_chart(report.series, q["window"].tz, teams)
        context.update({
            "report": report, "group_label": GROUP_LABELS[q["group_by"]],
            "used_hint": _of_allocated(report.total.used_pct, "GPU-hours really used"),
            "idle_hint": _of_allocated(_share(report.total.idle_allocated_gpu_hours, report.total.allocated_gpu_hours),
                                       "GPU-hours held while idle"),
            "total": report.total.as_dict(), "rows": [r.as_dict() for r in report.rows],
            "quota_columns": q["group_by"] in csv_export.QUOTA_GROUPS, "quota_rule": fairshare.QUOTA_RULE,
            "lent_rule": fairshare.LENT_RULE, "bookings_rule": booking_hours.RULE,
            "series": chart, "series_rows": _rows_for_table(chart),
            "breakdown": {"labels": [r.label or r.key for r in report.rows[:20]],
                          "allocated": [round(r.allocated_gpu_hours, 4) for r in report.rows[:20]],
                          "used": [round(r.used_gpu_hours, 4) for r in report.rows[:20]]},
        })
    return render(request, "reports/usage.html", context, status=200 if not query.errors else 400)


@login_required
def overview_page(request):
    query = ReportQuery(request.GET)
    visible, teams = _teams(request, request.GET.get("team", ""))
    context = _context(request, query, "overview")
    context.update({"visible_teams": visible, "csv_url": _csv_url("overview", request)})
    if query.is_valid():
        q = query.cleaned_data
        data = overview_service.overview(request.user, q["window"], teams)
        chart = _series_chart(data["series"], q["window"].tz, teams)
        now = data["now"]
        whose = "all teams" if request.user.is_staff and len(teams) == len(visible) else "your teams"
        context.update({
            "now_allocation": _pct_text(now["allocation_pct"]),
            "now_allocation_hint": f"{now['allocated_gpus']:g} of the fleet's {now['gpus']} GPUs held by {whose}",
            "now_utilization": _pct_text(now["utilization_pct"]),
            "now_utilization_hint": f"{now['used_gpus']:g} GPUs' worth used of what is allocated (last minutes)",
            "waiting_hint": (f"requests; the oldest for {human_duration(data['waiting']['oldest_wait_s'])}"
                             if data["waiting"]["count"] else "requests"),
        })
        context.update({"data": data, "now": data["now"], "waiting": data["waiting"], "queueing": data["queueing"],
                        "total": data["total"], "series": chart, "series_rows": _rows_for_table(chart)})
    return render(request, "reports/overview.html", context, status=200 if not query.errors else 400)
