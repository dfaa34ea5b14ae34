"""What site admins do to the fleet from its page: drain and undrain nodes, cordon GPUs, create,
rotate and revoke node agent tokens. Each goes through fleet.services and returns to the page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node

from .fleet_admin import back_to_fleet, require_site_admin


@login_required
@require_POST
def node_drain(request, name: str):
    require_site_admin(request)
    node = get_object_or_404(Node, name=name)
    fleet_services.drain(node.pk, audit.web(request.user), request.POST.get("reason", "")[:200])
    messages.success(request, f"Node {node.name} is draining: no new shares land there; what runs there keeps "
                     "running.")
    return back_to_fleet(request)


@login_required
@require_POST
def node_undrain(request, name: str):
    require_site_admin(request)
    node = get_object_or_404(Node, name=name)
    fleet_services.undrain(node.pk, audit.web(request.user))
    messages.success(request, f"Node {node.name} is ready: new shares may land there again.")
    return back_to_fleet(request)


@login_required
@require_POST
def gpu_cordon(request, pk: int):
    require_site_admin(request)
    gpu = get_object_or_404(Gpu.objects.select_related("node"), pk=pk)
    cordon = request.POST.get("cordon") == "1"
    what = f"GPU {gpu.index} on {gpu.node.name}"
    reason = " ".join(request.POST.get("reason", "").split())  # one line, as it is shown
    if cordon:
        problem = fleet_services.cordon_reason_problem(reason)
        if problem:
            messages.error(request, f"{what} was not cordoned: {problem}")
            return back_to_fleet(request)
    fleet_services.set_cordon(gpu.pk, audit.web(request.user), cordon, reason if cordon else "")
    messages.success(request, f"{what} is cordoned: no new shares; its shares keep running." if cordon
                     else f"{what} takes new shares again.")
    return back_to_fleet(request)


@never_cache
@login_required
@require_POST
def node_token(request, name: str):
    """Create or rotate (action=issue) or revoke (action=revoke) the node's agent token. A new
    key is shown on this answer only; it is never stored or shown again."""
    require_site_admin(request)
    node = get_object_or_404(Node, name=name)
    action = request.POST.get("action")
    if action == "revoke":
        fleet_services.revoke_node_token(node, audit.web(request.user))
        messages.success(request, f"The agent token of {node.name} is revoked: its agent is refused until a new "
                         "token is created.")
        return back_to_fleet(request)
    if action != "issue":
        raise Http404("no such action")
    rotated = bool(node.agent_token_hash)
    key = fleet_services.issue_node_token(node, audit.web(request.user))
    return render(request, "fleet/token.html", {"node": node, "key": key, "rotated": rotated})
