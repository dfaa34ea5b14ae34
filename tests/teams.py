"""Teams for tests, with the `*` quota (any GPU model) that a team's flat quota used to be."""

from __future__ import annotations

from decimal import Decimal

from portal.tenancy.models import Quota, Team, mib_to_gib

# The flat quota's defaults of before departments: what a team created without one gets here.
SHARE, MEMORY_MIB, GPUS = Decimal("1.000"), 80 * 1024, 4


def make_team(slug: str, name: str | None = None, *, quota_gpu_share=SHARE, quota_memory_mib: int = MEMORY_MIB,
              quota_max_gpus: int = GPUS, **fields) -> Team:
    team = Team.objects.create(slug=slug, name=name or slug, **fields)
    set_any_quota(team, quota_gpu_share, quota_memory_mib, quota_max_gpus)
    return team


def set_any_quota(team: Team, share=None, memory_mib: int | None = None, gpus: int | None = None) -> Quota:
    """Set the team's `*` quota (what is not given stays as it is)."""
    row, _ = Quota.objects.get_or_create(team=team, gpu_model="*", defaults={
        "gpu_share": SHARE, "gpu_memory_gib": mib_to_gib(MEMORY_MIB), "gpus": GPUS})
    if share is not None:
        row.gpu_share = Decimal(str(share))
    if memory_mib is not None:
        row.gpu_memory_gib = mib_to_gib(memory_mib)
    if gpus is not None:
        row.gpus = gpus
    row.save()
    return row
