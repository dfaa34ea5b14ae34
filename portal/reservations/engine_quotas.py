"""The organisation's quota tree as the engine sees it (`scheduler.core.QuotaTree`), read from the
departments, teams, their quotas per GPU model and their policy; and submit's one refusal for
quota: a request that can never run as asked.

Teams are named by slug (requests and shares carry it), departments `department:<slug>`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

from django.db.models import Q

from portal.precompiled import Precompiled, param_eq
from portal.reservations import quota
from portal.reservations.models import COUNTED, Allocation
from portal.tenancy.models import Department, Quota, Team, TeamPolicy
from portal.tenancy.policy import policy_of
from scheduler import core
from scheduler.core.fairshare import Ledger, demand_of

DEPARTMENT = "department:"
QUOTA_AMOUNTS = ("gpu_share", "gpu_memory_gib", "gpus", "borrow_gpu_share", "borrow_gpu_memory_gib", "borrow_gpus",
                 "lend_gpu_share", "lend_gpu_memory_gib", "lend_gpus", "weight")
DEFAULT_GRACE_S = 300


class NeverFits(Exception):
    """A request no quota, borrowing or idle capacity can ever run (beyond a hard limit)."""

    def __init__(self, message: str, team: Team):
        super().__init__(message)
        self.team = team


def unit_name(*, team: str | None = None, department: str | None = None) -> str:
    return team if team is not None else f"{DEPARTMENT}{department}"


def _milli(share: Decimal | None) -> int | None:
    return None if share is None else int((Decimal(share) * 1000).to_integral_value())


def _mib(gib: Decimal | None) -> int | None:
    return None if gib is None else int((Decimal(gib) * 1024).to_integral_value())


def bucket_quota(q: Quota) -> core.BucketQuota:
    return core.BucketQuota(
        milli=_milli(q.gpu_share), memory_mib=_mib(q.gpu_memory_gib), gpus=q.gpus,
        borrowing=core.Limits(_milli(q.borrow_gpu_share), _mib(q.borrow_gpu_memory_gib), q.borrow_gpus),
        lending=core.Limits(_milli(q.lend_gpu_share), _mib(q.lend_gpu_memory_gib), q.lend_gpus),
        weight=float(q.weight),
    )


_DEPARTMENTS = Precompiled(lambda: Department.objects.order_by().values_list("pk", "slug", "parent_id"))
_TEAMS = Precompiled(lambda: Team.objects.order_by().values_list("pk", "slug", "department_id", "allow_over_quota"))
_POLICIES = Precompiled(lambda: TeamPolicy.objects.order_by().values_list("team_id", "reclaim_grace_s",
                                                                          "limit_allow_over_quota"))
_QUOTAS = Precompiled(lambda: Quota.objects.order_by())


def load() -> core.QuotaTree:
    """The whole tree, read fresh (a few hundred rows in three statements)."""
    departments = {pk: (slug, parent) for pk, slug, parent in _DEPARTMENTS.all()}
    rows: dict[tuple[str, int], dict[str, core.BucketQuota]] = defaultdict(dict)
    for q in _QUOTAS.all():
        owner = ("team", q.team_id) if q.team_id is not None else ("department", q.department_id)
        rows[owner][q.gpu_model] = bucket_quota(q)
    policies = {team: (grace, allowed) for team, grace, allowed in _POLICIES.all()}
    units = []
    for pk, (slug, parent) in departments.items():
        units.append(core.Unit(unit_name(department=slug), unit_name(department=departments[parent][0])
                               if parent else "", rows.get(("department", pk), {}), team=False))
    for pk, slug, department, allow in _TEAMS.all():
        grace, limit_allows = policies.get(pk, (DEFAULT_GRACE_S, True))
        units.append(core.Unit(slug, unit_name(department=departments[department][0]) if department else "",
                               rows.get(("team", pk), {}), team=True, allow_over_quota=allow and limit_allows,
                               reclaim_grace_s=float(grace)))
    return core.QuotaTree(units)


_DEPARTMENT_ROWS = Precompiled(lambda: Department.objects.order_by().values_list(
    "pk", "slug", "parent_id", "quotas__gpu_model", "quotas__gpu_share", "quotas__gpu_memory_gib", "quotas__gpus",
    "quotas__borrow_gpu_share", "quotas__borrow_gpu_memory_gib", "quotas__borrow_gpus", "quotas__lend_gpu_share",
    "quotas__lend_gpu_memory_gib", "quotas__lend_gpus", "quotas__weight"))
_TEAM_QUOTAS = Precompiled(lambda: Quota.objects.filter(param_eq("team_id", "team")).order_by())


def path_tree(team: Team) -> core.QuotaTree:
    """The tree of `team` and its ancestors only (two statements): what submit needs to judge one
    request (its team's hard limits and how it would count), without reading every team."""
    departments: dict[int, tuple[str, int | None]] = {}
    rows: dict[int, dict[str, core.BucketQuota]] = defaultdict(dict)
    for pk, slug, parent, model, *amounts in _DEPARTMENT_ROWS.all():
        departments[pk] = (slug, parent)
        if model is not None:
            rows[pk][model] = bucket_quota(Quota(gpu_model=model, **dict(zip(QUOTA_AMOUNTS, amounts, strict=True))))
    units = []
    pk = team.department_id
    while pk is not None and len(units) <= len(departments):
        slug, parent = departments[pk]
        units.append(core.Unit(unit_name(department=slug), unit_name(department=departments[parent][0])
                               if parent else "", rows.get(pk, {}), team=False))
        pk = parent
    policy = policy_of(team)
    units.append(core.Unit(team.slug, unit_name(department=departments[team.department_id][0])
                           if team.department_id else "",
                           {q.gpu_model: bucket_quota(q) for q in _TEAM_QUOTAS.all(team=team.pk)}, team=True,
                           allow_over_quota=policy.allow_over_quota, reclaim_grace_s=float(policy.reclaim_grace_s)))
    return core.QuotaTree(units)


def models_to_judge(tree: core.QuotaTree, team: str, named: list[str], fleet_models) -> list[str]:
    """The models a request is judged on: those it names; else, when no unit on its team's path has
    a row for a particular model, one stands for all (every model resolves to the same quotas);
    else the fleet's models (`fleet_models()`, read only then)."""
    if named:
        return named
    specific = set()
    unit = team
    while unit:
        specific |= set(tree.units[unit].quotas) - {core.fairshare.WILDCARD}
        unit = tree.units[unit].parent
    return fleet_models() if specific else [core.fairshare.WILDCARD]


def never_fits(tree: core.QuotaTree, request: core.Request, models: list[str]) -> str | None:
    """Why `request` can never run on any of `models` (its team's hard limits), or None. The same
    verdict the cycle gives (`scheduler.core.fairshare.Ledger.verdict`), usage aside: a hard
    limit is about the request alone."""
    if not models:
        return None
    ledger = Ledger(tree, {m: (0, 0, 0) for m in models}, ())
    amount = demand_of(request)
    reasons = []
    for m in models:
        verdict = ledger.verdict(request.team, m, amount, request.priority)
        if not verdict.never:
            return None
        reasons.append(verdict.reason)
    return "; ".join(dict.fromkeys(reasons))


def admission_now(tree: core.QuotaTree, request: core.Request, models: list[str], held: dict) -> str:
    """How `request` would count if placed now, as far as its own team's quota and limits go (what
    others lend is the cycle's to judge): guaranteed within the quota, else borrowed, or
    opportunistic for priority 0 where only that is left. `held`: quota.held(team) of its team."""
    huge = (10**15, 10**15, 10**15)  # what others lend is not judged here
    ledger = Ledger(tree, {m: huge for m in {*models, *(model for _, model, _ in held)}}, ())
    for i, ((_, model, admission), use) in enumerate(held.items()):
        ledger.charge(f"held-{i}", request.team, model, (_milli(use.gpu_share), use.memory_mib, use.gpus),
                      core.Admission(admission))
    amount = demand_of(request)
    found = {ledger.verdict(request.team, m, amount, request.priority).admission for m in models}
    for admission in (core.Admission.GUARANTEED, core.Admission.BORROWED, core.Admission.OPPORTUNISTIC):
        if admission in found:
            return str(admission)
    return str(core.Admission.BORROWED)


def standings() -> list[core.fairshare.Standing]:
    """Every department's and team's standing now, per bucket: quota, what its subtree holds that
    counts, borrowed beyond its quota, lent to others (`scheduler.core.fairshare.standings`).
    Vectors are (compute milli, memory MiB, GPUs); units are named as in `load()`."""
    tree = load()
    slugs = dict(Team.objects.order_by().values_list("pk", "slug"))
    rows = quota.held()
    ledger = Ledger(tree, {model: (0, 0, 0) for _, model, _ in rows}, ())
    for i, ((team_id, model, admission), use) in enumerate(rows.items()):
        if slugs.get(team_id) in tree.units:
            ledger.charge(f"held-{i}", slugs[team_id], model, (_milli(use.gpu_share), use.memory_mib, use.gpus),
                          core.Admission(admission))
    return core.fairshare.standings(ledger)


HALF_LIVES_KEPT = 5  # use older than this many half-lives weighs under 3 %: not read


def past_use(half_life_s: float, now) -> dict[str, float]:
    """team slug → its GPU share held over the past, decayed: the average of what it held (milli),
    each moment weighted by 2^(-age / half_life_s), over the last HALF_LIVES_KEPT half-lives.
    Counted use only (guaranteed and borrowed). Empty when half_life_s is 0 (off)."""
    if half_life_s <= 0:
        return {}
    k = math.log(2) / half_life_s
    horizon = HALF_LIVES_KEPT * half_life_s
    since = now - timedelta(seconds=horizon)
    weight_total = (1 - math.exp(-k * horizon)) / k
    out: dict[str, float] = {}
    rows = (Allocation.objects.filter(Q(released_at__isnull=True) | Q(released_at__gt=since),
                                      created_at__lt=now, reservation__admission__in=COUNTED)
            .order_by().values_list("reservation__team__slug", "gpu_request", "created_at", "released_at"))
    for team, share, start, end in rows:
        a = (now - max(start, since)).total_seconds()  # age at the start of the part in the window
        b = (now - min(end or now, now)).total_seconds()  # age at its end
        if a <= b:
            continue
        weight = (math.exp(-k * b) - math.exp(-k * a)) / k
        out[team] = out.get(team, 0.0) + float(share) * 1000 * weight / weight_total
    return out
