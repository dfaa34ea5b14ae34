"""Site admins run the fleet in the browser: every node as a row of GPUs, each GPU drawn as one
slice per share (coloured by team) with its memory as a second bar and live utilization; drain
and undrain nodes, cordon GPUs, create, rotate and revoke node agent tokens; create teams, put them
in a department and set the limits on their policy (their quota rows: quota_editor.py). Site admins
only (everyone else: 403), like the API."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from urllib.parse import urlsplit

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Count
from django.http import Http404, HttpResponseBadRequest, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_GET, require_POST

from portal.audit import services as audit
from portal.errors import RuleViolation
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node, NodeStatus
from portal.reservations.models import Allocation
from portal.telemetry import live
from portal.telemetry.live.groups import FLEET
from portal.tenancy import departments, policy, teams
from portal.tenancy.models import Department, Team, TeamPolicy

from . import navigation, quota_lines
from .fleet_cells import gpu_cell
from .numbers import finite, whole_seconds
from .quota_editor import in_words
from .templatetags.tessera import team_class
from .units import page_errors

NODES_PER_PAGE = 20  # 160 GPUs of 8: within one live socket's 200 groups


def _staff(request) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("only site admins may see the fleet")


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
    for n in nodes:
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
    _staff(request)
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
    _staff(request)
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


def _back(request):
    target = request.POST.get("next", "")
    return redirect(target if target.startswith("/fleet/") else "fleet")


@login_required
@require_POST
def node_drain(request, name: str):
    _staff(request)
    node = get_object_or_404(Node, name=name)
    fleet_services.drain(node.pk, audit.web(request.user), request.POST.get("reason", "")[:200])
    messages.success(request, f"Node {node.name} is draining: no new shares land there; what runs there keeps "
                     "running.")
    return _back(request)


@login_required
@require_POST
def node_undrain(request, name: str):
    _staff(request)
    node = get_object_or_404(Node, name=name)
    fleet_services.undrain(node.pk, audit.web(request.user))
    messages.success(request, f"Node {node.name} is ready: new shares may land there again.")
    return _back(request)


@login_required
@require_POST
def gpu_cordon(request, pk: int):
    _staff(request)
    gpu = get_object_or_404(Gpu.objects.select_related("node"), pk=pk)
    cordon = request.POST.get("cordon") == "1"
    what = f"GPU {gpu.index} on {gpu.node.name}"
    reason = " ".join(request.POST.get("reason", "").split())  # one line, as it is shown
    if cordon:
        problem = fleet_services.cordon_reason_problem(reason)
        if problem:
            messages.error(request, f"{what} was not cordoned: {problem}")
            return _back(request)
    fleet_services.set_cordon(gpu.pk, audit.web(request.user), cordon, reason if cordon else "")
    messages.success(request, f"{what} is cordoned: no new shares; its shares keep running." if cordon
                     else f"{what} takes new shares again.")
    return _back(request)


@never_cache
@login_required
@require_POST
def node_token(request, name: str):
    """Create or rotate (action=issue) or revoke (action=revoke) the node's agent token. A new
    key is shown on this answer only; it is never stored or shown again."""
    _staff(request)
    node = get_object_or_404(Node, name=name)
    action = request.POST.get("action")
    if action == "revoke":
        fleet_services.revoke_node_token(node, audit.web(request.user))
        messages.success(request, f"The agent token of {node.name} is revoked: its agent is refused until a new "
                         "token is created.")
        return _back(request)
    if action != "issue":
        raise Http404("no such action")
    rotated = bool(node.agent_token_hash)
    key = fleet_services.issue_node_token(node, audit.web(request.user))
    return render(request, "fleet/token.html", {"node": node, "key": key, "rotated": rotated})


# Teams: create, department and limits (quota rows: quota_editor.py) ----------------------------

def _team_rows():
    """Every team with its department, quota rows, where it stands per bucket and its limits (a
    handful of queries for all of them)."""
    lines = quota_lines.standings()
    rows = quota_lines.rows_by_unit()
    limits = {p.team_id: p for p in TeamPolicy.objects.all()}
    return [{"team": team, "rows": rows.get(team.slug, []), "lines": lines.get(team.slug, []),
             "limits": limits.get(team.pk)} for team in Team.objects.select_related("department").order_by("slug")]


def _department_choices():
    return list(Department.objects.order_by("slug").values_list("slug", "name"))


@login_required
def teams_page(request):
    _staff(request)
    form = {"slug": "", "name": "", "department": ""}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form}
        try:
            # No quota of its own yet (a `*` row of 0): it fits under any department, and the
            # site admin gives it its rows next, on its quota page.
            team = teams.create_team(audit.web(request.user), form["slug"], form["name"], form["department"] or None,
                                     quota_gpu_share="0", quota_memory_mib="0", quota_max_gpus="0")
        except RuleViolation as exc:
            errors, status = {k: [in_words(m) for m in v] for k, v in exc.errors.items()}, 400
        else:
            where = f" under department {team.department.slug}" if team.department_id else ""
            messages.success(request, f"Team {team.slug} created{where}, with no quota yet: give it its quota rows "
                             "here, then its first admin on its Members page.")
            return redirect("fleet-team-quotas", slug=team.slug)
    return render(request, "fleet/teams.html", {"rows": _team_rows(), "form": form, "errors": errors,
                                               "departments": _department_choices()}, status=status)


LIMIT_FORM = ("limit_duration_h", "limit_priority", "limit_idle_after_min", "limit_idle_threshold_pct",
              "limit_idle_warning_min")


@login_required
def team_limits_page(request, slug: str):
    _staff(request)
    team = get_object_or_404(Team.objects.select_related("department"), slug=slug)
    current = policy.policy_of(team)
    limits = current.limits
    form = {"name": team.name, "department": team.department.slug if team.department_id else "",
            "limit_duration_h": f"{limits.duration_s / 3600:g}", "limit_priority": str(limits.priority),
            "limit_idle_after_min": f"{limits.idle_after_s / 60:g}" if limits.idle_after_s else "",
            "limit_idle_threshold_pct": f"{float(limits.idle_threshold) * 100:g}",
            "limit_idle_warning_min": f"{limits.idle_warning_s / 60:g}" if limits.idle_warning_s else "",
            "limit_require_reclaim": limits.require_reclaim, "limit_allow_over_quota": limits.allow_over_quota}
    errors: dict[str, list[str]] = {}
    status = 200
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form if not isinstance(form[k], bool)} | {
            "limit_require_reclaim": request.POST.get("limit_require_reclaim") == "on",
            "limit_allow_over_quota": request.POST.get("limit_allow_over_quota") == "on"}
        changes = {"limit_priority": form["limit_priority"], "limit_require_reclaim": form["limit_require_reclaim"],
                   "limit_allow_over_quota": form["limit_allow_over_quota"]}
        for key, field, unit in (("limit_duration_h", "limit_duration_s", 3600),
                                 ("limit_idle_after_min", "limit_idle_after_s", 60),
                                 ("limit_idle_warning_min", "limit_idle_warning_s", 60)):
            if not form[key]:
                changes[field] = None
                continue
            try:
                changes[field] = whole_seconds(form[key], unit)
            except ValueError:
                errors[field] = [f"a number ({'hours' if unit == 3600 else 'minutes'})"]
        try:
            changes["limit_idle_threshold"] = finite(form["limit_idle_threshold_pct"] or "0") / 100
        except ValueError:
            errors["limit_idle_threshold"] = ["a percentage, e.g. 5"]
        if changes.get("limit_duration_s") is None and "limit_duration_s" not in errors:
            errors["limit_duration_s"] = ["give the longest duration in hours"]
        if not errors:
            try:
                # Name, department and limits are one change for the admin: all or nothing.
                with transaction.atomic():
                    teams.set_quota(team, audit.web(request.user), {"name": form["name"]})
                    departments.move_team(team, audit.web(request.user), form["department"] or None)
                    policy.set_limits(team, audit.web(request.user), changes)
            except RuleViolation as exc:
                errors = page_errors({k: [in_words(m) for m in v] for k, v in exc.errors.items()})
            else:
                messages.success(request, f"Team {team.slug} saved.")
                return redirect("fleet-team", slug=team.slug)
        status = 400
    return render(request, "fleet/team.html", {
        "team": team, "form": form, "errors": errors, "policy": current, "departments": _department_choices(),
        "rows": quota_lines.rows_of(team=team), "lines": quota_lines.standings().get(team.slug, [])}, status=status)


navigation.register("Fleet", "fleet", allowed=navigation.staff, order=70)
navigation.register("Teams & quotas", "fleet-teams", allowed=navigation.staff, order=72)
