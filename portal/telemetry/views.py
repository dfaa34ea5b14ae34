"""HTTP side of telemetry: the live state a browser re-fetches after a gap, and /metrics."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from portal.reservations.models import Allocation

from . import conf, live
from .metrics import TelemetryCollector
from .services import latest_gpu_readings, latest_share_readings

MAX_STATE_GROUPS = 200


def _group_state(group: live.Group, seq: int) -> dict:
    if group.kind == "fleet":
        # No state to send: "every node may have changed up to `seq`" (the page re-reads the rows
        # it shows unless it was drawn at that seq or later).
        return {"type": "nodes", "data": {"all": True, "seq": seq}}
    if group.kind == "user":
        from portal.notifications.live import state

        return state(group.id)
    if group.kind == "gpu":
        reading = latest_gpu_readings([group.id]).get(group.id)
        return {"type": "gpu", "data": reading}
    live_allocations = Allocation.objects.filter(released_at__isnull=True)
    if group.kind == "team":
        ids = set(live_allocations.filter(reservation__team_id=group.id).values_list("reservation_id", flat=True))
    else:
        ids = {group.id}
    shares = sorted(latest_share_readings(ids).values(), key=lambda s: (s["reservation"], s["gpu"]))
    return {"type": "shares", "data": {"shares": shares}}


@require_GET
def live_state(request: HttpRequest) -> JsonResponse:
    """GET /telemetry/live/state/?groups=gpu:3,team:1 → {"groups": {name: {"seq", "type", "data"}},
    "refused": {name: reason}}. Messages with seq ≤ the answer's seq are already in it."""
    if not request.user.is_authenticated:
        return JsonResponse({"detail": "sign in first"}, status=401)
    raw = request.GET.get("groups", "")
    names = [n for n in raw.split(",") if n]
    if not names or len(names) > MAX_STATE_GROUPS or set(request.GET) - {"groups"}:
        return JsonResponse({"detail": f"groups: 1 to {MAX_STATE_GROUPS} comma-separated group names "
                                       "(gpu:<id>, team:<id>, reservation:<id>, fleet), and no other parameter"},
                            status=400)
    refused, visible = {}, []
    for name in dict.fromkeys(names):
        group = live.parse_group(name)
        if group is None:
            refused[name] = "not a group name: gpu:<id>, team:<id>, reservation:<id> or fleet"
        elif not live.may_see(request.user, group):
            refused[name] = "not found or not visible to you"
        else:
            visible.append(group)
    # The counters first: whatever was published up to them is already in the database.
    seqs = live.store().current_seqs([g.name for g in visible])
    groups = {g.name: {"seq": seqs[g.name], **_group_state(g, seqs[g.name])} for g in visible}
    return JsonResponse({"groups": groups, "refused": refused})


def _metrics_allowed(request: HttpRequest) -> bool:
    token = conf.metrics_token()
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())
    return request.user.is_authenticated and request.user.is_staff


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape: a bearer token (TESSERA_METRICS_TOKEN) or a staff session."""
    if not _metrics_allowed(request):
        response = HttpResponse("metrics need a bearer token (TESSERA_METRICS_TOKEN) or a staff session\n",
                                status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TelemetryCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
