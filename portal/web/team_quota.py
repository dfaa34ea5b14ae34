"""A team's quota view (/team/<slug>/quota/): its line per bucket, who borrows from it, per member,
and what waits and why. Read-only: site admins set quotas (quota_editor.py)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required

from portal.reservations import team_usage
from portal.tenancy import policy

from . import quota_lines
from .team_admin import page, team_of
from .templatetags.tessera import share


@login_required
def quota_page(request, slug: str):
    """The team's line per bucket (quota, in use, borrowed beyond it, lent to others) and who
    borrows now from the group it lends to; per member; what waits and why."""
    team = team_of(request, slug)
    lines = quota_lines.standings()
    current = policy.policy_of(team)
    use = team_usage.team_usage(team)
    mine = lines.get(team.slug, [])
    beyond = "allowed: priority-0 requests, preemptible" if use.allow_over_quota else "not allowed by the policy"
    return page(request, team, "quota", "team/quota.html", {
        "usage": use, "lines": mine, "only_any": len(mine) == 1, "beyond": beyond,
        "opportunistic": f"{share(use.opportunistic_in_use)} GPU",
        "borrowers": quota_lines.borrowers_from(team.slug, lines), "grace": current.reclaim_grace_s,
        "department": team.department})
