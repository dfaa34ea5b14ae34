from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from . import scope
from .forms import ReportQuery
from .services import usage


@login_required
def utilization_page(request):
    if not scope.may_see_reports(request.user):
        raise PermissionDenied("reports are for team managers, team admins and site admins")
    query = ReportQuery(request.GET)
    report = None
    if query.is_valid():
        q = query.cleaned_data
        report = usage(request.user, q["group_by"], q["window"], scope.teams_for(request.user))
    rows = report.rows if report else []
    return render(request, "reports/utilization.html", {"query": query, "rows": rows, "bars": []})
