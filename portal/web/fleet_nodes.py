"""The fleet page (/fleet/): every node as a row of GPUs, each GPU drawn as one slice per share
(coloured by team) with its memory as a second bar and live utilization; filters, pages, and the
rows fragment fleet.js swaps in when the live `fleet` group names nodes."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from urllib.parse import urlsplit

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpResponseBadRequest, QueryDict
from django.shortcuts import render
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_GET

from portal.fleet import drain_plans
from portal.fleet import services as fleet_services
from portal.fleet.models import OPEN_DRAINS, Gpu, Node, NodeStatus, PlannedDrain
from portal.reservations.models import Allocation
from portal.telemetry import live
from portal.telemetry.live.groups import FLEET
from portal.tenancy.models import Team

from .fleet_admin import require_site_admin
from .fleet_cells import gpu_cell
from .templatetags.tessera import team_class

NODES_PER_PAGE = 20  # 160 GPUs of 8: within one live socket's 200 groups


def _pct(value, total) -> float:
    return round(float(value) / float(total) * 100, 2) if total else 0.0


def fleet_rows(nodes: list[dict]) -> list[dict]:
    """The page's nodes with their GPUs and each GPU's live shares, laid out for drawing:
    three queries whatever the page size (nodes given, GPUs, allocations)."""
    by_node: dict[int, list[dict]] = defaultdict(list)
    gpu_rows = list(Gpu.objects.filter(node_id__in=[n["id"] for n in nodes]).order_by("node_id", "index").values(
        "id", "node_id", "index", "uuid", "model", "model_label", "memory_mib", "healthy", "cordoned",
        "cordon_reason"))
    shares: dict[int, list[tuple]] = defaultdict(list)
    for row in (Allocation.objects.filter(released_at__isnull=True, gpu__node_id__in=[n["id"] for n in nodes])
                .order_by("gpu_id", "reservation_id")
                .values_list("gpu_id", "reservation_id", "gpu_request", "gpu_limit", "gpu_memory_mib",
                             "reservation__team_id", "reservation__team__slug", "reservation__owner__username",
                             "reservation__state", "reservation__client_node__name")):
        shares[row[0]].append(row[1:])
    for g in gpu_rows:
        x = mx = Decimal(0)
        slices = []
        for rid, share, limit, memory, team_id, slug, owner, state, remote_from in shares.get(g["id"], ()):
            slices.append({
                "reservation": rid, "team": slug, "owner": owner, "state": state, "share": share, "limit": limit,
                "remote_from": remote_from,  # a remote share: its pod runs on that node (scheduler.core.remote)
                "memory_mib": memory, "cls": team_class(team_id),
                "x": _pct(x, 1), "w": _pct(share, 1), "mx": _pct(mx, g["memory_mib"]),
                "mw": _pct(memory, g["memory_mib"]),
            })
            x += share
            mx += memory
        g.update(slices=slices, used=x, memory_used=mx)
        by_node[g["node_id"]].append(g)
    for n in nodes:
        n["gpus"] = by_node.get(n["id"], [])
    return nodes


def _summary() -> dict:
    counts = dict(Node.objects.values_list("status").annotate(n=Count("id")))
    return {"counts": {s: counts.get(s, 0) for s in NodeStatus.values}, "total": sum(counts.values())}


def _draw(nodes: list[dict]) -> list[dict]:
    nodes = fleet_rows(nodes)
    drains: dict[int, list[str]] = defaultdict(list)
    for node_id, start, end in (PlannedDrain.objects.filter(node_id__in=[n["id"] for n in nodes],
                                                            state__in=OPEN_DRAINS)
                                .order_by("starts_at").values_list("node_id", "starts_at", "ends_at")):
        drains[node_id].append(drain_plans.window_text(start, end))
    for n in nodes:
        n["drains"] = drains.get(n["id"], [])
        n["has_token"] = bool(n.pop("agent_token_hash"))
        for g in n["gpus"]:
            g["html"] = gpu_cell(g, n["name"])
    return nodes


NODE_FIELDS = ("id", "name", "status", "status_reason", "last_seen", "labels", "agent_token_hash",
               "agent_token_created_at")


class FilterRefused(ValueError):
    """A filter the database cannot take (PostgreSQL text holds no NUL character): a 400."""


def filtered_nodes(params):
    """(the nodes the page's filters keep, by name; the filters as read)."""
    model = params.get("model", "").strip()
    name = params.get("node", "").strip()[:253]
    state = params.get("state", "").strip()
    for field, value in (("model", model), ("node", name)):
        if "\x00" in value:
            raise FilterRefused(f"{field}: must not contain a NUL character")
    qs = Node.objects.order_by("name")
    if name:
        qs = qs.filter(name__icontains=name)
    if state in NodeStatus.values:
        qs = qs.filter(status=state)
    if model:
        qs = qs.filter(pk__in=Gpu.objects.filter(model=model).values("node_id"))  # a semi-join, no DISTINCT
    return qs, {"model": model, "node": name, "state": state}


def fleet_context(params, back: str = "/fleet/") -> dict:
    # The live counter first: whatever the `fleet` group announced up to it is in what is read
    # below, so the page need not re-read its rows when its socket says "up to this seq".
    live_seq = live.store().current_seqs([FLEET])[FLEET]
    qs, filters = filtered_nodes(params)
    model, name, state = filters["model"], filters["node"], filters["state"]
    page = Paginator(qs.values(*NODE_FIELDS), NODES_PER_PAGE).get_page(params.get("page"))
    nodes = _draw(list(page.object_list))
    return {
        **_summary(), "live_seq": live_seq, "back": back, "reason_max": fleet_services.REASON_MAX,
        "page": page, "nodes": nodes, "models": list(Gpu.objects.values_list("model", flat=True).distinct()
                                                     .order_by("model")),
        "filters": {"model": model, "node": name, "state": state}, "states": NodeStatus.choices,
        "gpu_ids": [g["id"] for n in nodes for g in n["gpus"]],
        "teams": Team.objects.order_by("slug"),
    }


# Compressed (340 KB of repetitive markup → 14 KB: bench/results/web/fleet-size.md), unlike the
# portal as a whole. BREACH needs a secret that stays the same across responses in a compressed
# body that also reflects attacker input (the filters here): the only secret on these pages is the
# CSRF token, which Django masks afresh in every response, and GZipMiddleware pads each body with
# random bytes. Pages that show a secret once (a node's new agent token, an API token) are never
# compressed, so no site-wide GZipMiddleware.
@gzip_page
@login_required
def fleet_page(request):
    require_site_admin(request)
    try:
        context = fleet_context(request.GET, request.get_full_path())
    except FilterRefused as exc:
        return HttpResponseBadRequest(str(exc))
    template = "fleet/_nodes.html" if request.headers.get("HX-Request") else "fleet/fleet.html"
    return render(request, template, context)


MAX_ROWS = 100


@gzip_page
@login_required
@require_GET
def fleet_rows_page(request):
    """GET /fleet/rows/?ids=3,7&next=/fleet/?page=2 → the rows of those nodes as the page draws
    them, and the summary: what fleet.js swaps in when the `fleet` live group names nodes."""
    require_site_admin(request)
    raw = [i for i in request.GET.get("ids", "").split(",") if i]
    if not raw or len(raw) > MAX_ROWS or not all(i.isascii() and i.isdigit() and len(i) < 19 for i in raw):
        return HttpResponseBadRequest(f"ids: 1 to {MAX_ROWS} node ids, comma-separated")
    back = request.GET.get("next", "")
    back = back if back.startswith("/fleet/") else "/fleet/"
    # Only the nodes the page's filters still keep: fleet.js takes a row it asked for and did not
    # get back off the page (a node drained while the page shows "ready" ones).
    try:
        kept, _ = filtered_nodes(QueryDict(urlsplit(back).query))
    except FilterRefused as exc:
        return HttpResponseBadRequest(f"next: {exc}")
    nodes = _draw(list(kept.filter(pk__in={int(i) for i in raw}).values(*NODE_FIELDS)))
    return render(request, "fleet/_rows.html", {**_summary(), "nodes": nodes, "back": back})
