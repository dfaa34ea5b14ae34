"""The frame of the site admins' pages (/fleet/): who may see them, where an action returns, and
their menu entries. The pages: fleet_nodes.py (every node as a row of GPUs, live), fleet_actions.py
(drain, undrain, cordon, node agent tokens), fleet_drains.py (a node's planned drains),
fleet_teams.py (create teams, their department and the limits on their policy; their quota rows:
quota_editor.py). Site admins only (everyone else: 403), like the API."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect

from portal.tenancy import roles

from . import navigation


def require_site_admin(request, doing: str = "see the fleet") -> None:
    """403 for anyone but a site admin: the check of every site admin's page (/fleet/…)."""
    if not roles.is_site_admin(request.user):
        raise PermissionDenied(f"only site admins may {doing}")


def back_to_fleet(request):
    """Back to the fleet page the action was taken on (its filters and page kept)."""
    target = request.POST.get("next", "")
    return redirect(target if target.startswith("/fleet/") else "fleet")


navigation.register("Fleet", "fleet", allowed=navigation.site_admin, order=70)
navigation.register("Teams & quotas", "fleet-teams", allowed=navigation.site_admin, order=72)
