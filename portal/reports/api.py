"""`GET /api/v1/reports/usage/` and `/api/v1/reports/overview/`: JSON, or CSV with `?format=csv`.

Only team managers, team admins and site admins get reports, and only of their teams (scope.py).
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.query import refuse_empty, refuse_unknown

from . import csv_export, overview, scope
from .forms import PARAMS, ReportQuery
from .services import GROUPS, usage
from .window import RANGES

WINDOW_PARAMS = [
    OpenApiParameter("range", str, enum=list(RANGES), description="up to now; default 7d (or give since/until)"),
    OpenApiParameter("since", OpenApiTypes.STR, description="date (2026-11-16) or date-time, read in tz"),
    OpenApiParameter("until", OpenApiTypes.STR, description="date (that day included) or date-time; default now"),
    OpenApiParameter("tz", str, description="IANA time zone for dates and chart buckets; default UTC"),
    OpenApiParameter("team", str, description="one of your teams (default: all you may see)"),
    OpenApiParameter("format", str, enum=["json", "csv"], description="csv: the same rows and totals as a table"),
]
OK = {(200, "application/json"): OpenApiTypes.OBJECT,
      (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="?format=csv: the rows, then a Total row")}
ERRORS = {400: OpenApiResponse(description="Invalid query, per parameter"),
          403: OpenApiResponse(description="Reports are for team managers, team admins and site admins")}


class _ReportView(APIView):
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, csv_export.CsvRenderer]
    params = PARAMS

    def perform_content_negotiation(self, request, force=False):
        wanted = request.query_params.get("format")
        if request.method not in ("GET", "HEAD"):
            return JSONRenderer(), JSONRenderer.media_type  # OPTIONS describes the view: no table of it
        if not force and wanted is not None and wanted not in ("json", "csv", "api"):
            raise ValidationError({"format": [f"unknown format '{wanted}'; use json or csv"]})
        return super().perform_content_negotiation(request, force)

    def query(self, request) -> dict:
        refuse_unknown(request.query_params, self.params)
        refuse_empty(request.query_params, {"group_by", "range", "tz", "team"})
        form = ReportQuery(request.query_params)
        if not form.is_valid():
            raise ValidationError({k: [str(e) for e in v] for k, v in form.errors.items()})
        q = form.cleaned_data
        q["teams"] = scope.teams_for(request.user, q.get("team", ""))
        return q

    def handle_exception(self, exc):
        # Errors answer JSON, as everywhere in the API, even when CSV was asked for.
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), "application/json"
        return super().handle_exception(exc)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if getattr(request, "accepted_renderer", None) and request.accepted_renderer.format == "csv" \
                and response.status_code == 200:
            response["Content-Disposition"] = f'attachment; filename="{self.filename(response.data)}"'
        return response


class UsageReportView(_ReportView):
    """GPU time allocated versus really used, grouped by team, user, node, GPU model, GPU or
    reservation, with idle allocated time, burst above requests, opportunistic time and the
    reservations that sat idle longest."""

    @extend_schema(parameters=[OpenApiParameter("group_by", str, enum=list(GROUPS), description="default: team"),
                               *WINDOW_PARAMS], responses={**OK, **ERRORS})
    def get(self, request):
        q = self.query(request)
        return Response(usage(request.user, q["group_by"], q["window"], q["teams"]).as_dict())

    def csv_table(self, data):
        return csv_export.usage_table(data)

    def filename(self, data) -> str:
        return f"tessera-usage-by-{data['group_by']}-{data['since']:%Y%m%d%H%M}-{data['until']:%Y%m%d%H%M}.csv"


class OverviewReportView(_ReportView):
    """The fleet now (allocation, utilization, free, partly allocated and stranded GPUs, waiting
    requests and why) and over the window (allocated versus used by team, queueing delay)."""

    params = PARAMS - {"group_by"}

    @extend_schema(parameters=WINDOW_PARAMS, responses={**OK, **ERRORS})
    def get(self, request):
        q = self.query(request)
        return Response(overview.overview(request.user, q["window"], q["teams"]))

    def csv_table(self, data):
        return csv_export.overview_table(data)

    def filename(self, data) -> str:
        return f"tessera-overview-{data['since']:%Y%m%d%H%M}-{data['until']:%Y%m%d%H%M}.csv"

