from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from .forms import ReportQuery
from .services import utilization


@login_required
def utilization_page(request):
    query = ReportQuery(request.GET)  # every field has a default, so an empty query is valid
    rows = []
    if query.is_valid():
        q = query.cleaned_data
        rows = utilization(request.user, q["group_by"], q["since"], q["until"])
    scale = max([r.allocated_gpu_hours for r in rows] + [r.used_gpu_hours for r in rows] + [1e-9])
    return render(request, "reports/utilization.html", {
        "query": query, "rows": rows,
        "bars": [(r, 100 * r.allocated_gpu_hours / scale, 100 * r.used_gpu_hours / scale) for r in rows],
    })
