"""Hierarchical quotas per GPU model, borrowing and lending, and the fair share of what is left.

The organisation is a tree: departments (nested) above teams. Every unit (team or department) may
have a quota per **bucket**: a GPU model, or `*` for every model without a row of its own at that
unit. A quota has three resources (compute in milli-GPUs, GPU memory in MiB, GPUs held) and, per
resource, a borrowing limit (how far beyond its quota the unit's subtree may go) and a lending limit
(how much of its unused quota others may use), and a weight for sharing the surplus.

For one GPU model M, a department without a row covering M (neither M nor `*`) is transparent: its
children count directly under its nearest ancestor that has one (the organisation at the top). A
team without one has quota 0 for M: all it holds of M is borrowed.

A request of team t for demand d on model M is admitted as
- **guaranteed** when t's own usage of M's bucket plus d stays within t's quota. When with d a
  department on t's path would pass its quota + borrowing limit (others below it borrowed what t
  lent), the verdict says `reclaim`: the request takes those borrowed shares back (fairqueue)
  instead of placing beyond the department's limit;
- **borrowed** when not, but every unit on t's path stays within quota + borrowing limit and the
  room exists: what the fleet's ready GPUs of M hold beyond counted use, less the unused quota that
  each unit's siblings keep (unused beyond their lending limit);
- **opportunistic** when neither, and the request has priority 0 and the team allows it: it runs on
  idle capacity, is not counted and may be preempted by any higher priority;
- else it waits. It can **never** run (beyond a hard limit) when d alone exceeds quota + borrowing
  limit of a unit on its path, for every model it may use, and it cannot be opportunistic.

Counted usage (guaranteed + borrowed) is charged at placement; pending requests are only demand.

Fair share (`deserved`): per model, top down, each parent's share (the organisation's: the ready
capacity of the model) goes first to each child's quota as far as the child's demand (running +
waiting) needs it; the rest to children with unmet demand by weight, water-filling on the dominant
resource (the larger of compute and memory as a fraction of what is left), capped by borrowing
limits. A team's **saturation** on a model is max over compute and memory of used / deserved. The
queue admits the team with the lowest saturation after admission first (guaranteed requests before
the rest), and reclaim takes from the team with the highest saturation first.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from .model import MILLI, Request, Share

WILDCARD = "*"
ROOT = ""  # the organisation: the parent of top-level departments and of teams without one
INF = math.inf
Vec = tuple[float, float, float]  # (compute milli, GPU memory MiB, GPUs held)
ZERO: Vec = (0, 0, 0)
RESOURCES = ("compute", "memory", "GPUs")


class Admission(StrEnum):
    GUARANTEED = "guaranteed"
    BORROWED = "borrowed"
    OPPORTUNISTIC = "opportunistic"


COUNTED = frozenset({Admission.GUARANTEED, Admission.BORROWED})


@dataclass(frozen=True)
class Limits:
    """Per resource; None: unlimited."""

    milli: int | None = None
    memory_mib: int | None = None
    gpus: int | None = None

    def vec(self) -> Vec:
        return tuple(INF if v is None else v for v in (self.milli, self.memory_mib, self.gpus))  # type: ignore[return-value]


@dataclass(frozen=True)
class BucketQuota:
    milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    borrowing: Limits = Limits()
    lending: Limits = Limits()
    weight: float = 1.0

    def __post_init__(self) -> None:
        if min(self.milli, self.memory_mib, self.gpus) < 0:
            raise ValueError("a quota must not be negative")
        if not self.weight > 0:
            raise ValueError("a quota's weight must be positive")

    def vec(self) -> Vec:
        return (self.milli, self.memory_mib, self.gpus)


NO_QUOTA = BucketQuota(lending=Limits(0, 0, 0))  # a team without a row: holds nothing of its own, lends nothing


@dataclass(frozen=True)
class Unit:
    """A team (`team=True`, named by its slug: requests and shares carry it) or a department."""

    name: str
    parent: str = ROOT
    quotas: Mapping[str, BucketQuota] = field(default_factory=dict)
    team: bool = True
    allow_over_quota: bool = True
    reclaim_grace_s: float = 300.0


def demand_of(req: Request) -> Vec:
    n = max(req.gpu_count, 1)
    return (req.milli * n, req.gpu_memory_mib * n, n)


def held_by(share: Share, gpus: int = 1) -> Vec:
    from .model import to_milli

    return (to_milli(share.gpu_request) * gpus, share.gpu_memory_mib * gpus, gpus)


def vec_add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def _max(a: Vec, b: Vec) -> Vec:
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]))


def _min(a: Vec, b: Vec) -> Vec:
    return (min(a[0], b[0]), min(a[1], b[1]), min(a[2], b[2]))


def _pos(a: Vec) -> Vec:
    return (max(a[0], 0), max(a[1], 0), max(a[2], 0))


def vec_le(a: Vec, b: Vec) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]


def vec_scale(a: Vec, f: float) -> Vec:
    return (a[0] * f, a[1] * f, a[2] * f)


def amount_text(v: Vec, resource: int) -> str:
    """One resource in the user's units: GPU share (1.0 a GPU), GiB, GPUs."""
    x = v[resource]
    if x == INF:
        return "unlimited"
    if resource == 0:
        return f"{x / MILLI:.3f}".rstrip("0").rstrip(".") if x % MILLI else f"{x / MILLI:.1f}"
    if resource == 1:
        return f"{x / 1024:.1f} GiB"
    return f"{int(x)}"


RESOURCE_WORDS = ("share", "of GPU memory", "GPUs")


class QuotaTree:
    """The units, validated (parents exist, no cycles), with what a model resolves to at each."""

    def __init__(self, units: Iterable[Unit]) -> None:
        self.units: dict[str, Unit] = {}
        for u in units:
            if u.name == ROOT or u.name in self.units:
                raise ValueError(f"unit name {u.name!r} is empty or repeats")
            self.units[u.name] = u
        for u in self.units.values():
            seen = {u.name}
            p = u.parent
            while p != ROOT:
                if p not in self.units:
                    raise ValueError(f"unit {u.name}: parent {p} is not in the tree")
                if p in seen:
                    raise ValueError(f"unit {u.name}: its parents form a cycle")
                if self.units[p].team:
                    raise ValueError(f"unit {u.name}: parent {p} is a team")
                seen.add(p)
                p = self.units[p].parent
        self._paths: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}

    def bucket(self, unit: str, model: str) -> str | None:
        """The bucket `model` resolves to at `unit`; None: a department with no row covering it."""
        quotas = self.units[unit].quotas
        if model in quotas:
            return model
        if WILDCARD in quotas:
            return WILDCARD
        return WILDCARD if self.units[unit].team else None

    def quota(self, unit: str, bucket: str) -> BucketQuota:
        return self.units[unit].quotas.get(bucket, NO_QUOTA)

    def path(self, team: str, model: str) -> tuple[tuple[str, str], ...]:
        """(unit, bucket) from the team up to its top-level ancestor, transparent departments left out."""
        key = (team, model)
        found = self._paths.get(key)
        if found is None:
            out = []
            unit = team
            while unit != ROOT:
                bucket = self.bucket(unit, model)
                if bucket is not None:
                    out.append((unit, bucket))
                unit = self.units[unit].parent
            found = self._paths[key] = tuple(out)
        return found

    def parent_of(self, team_path: tuple[tuple[str, str], ...], i: int) -> str:
        return team_path[i + 1][0] if i + 1 < len(team_path) else ROOT

    def is_team(self, name: str) -> bool:
        u = self.units.get(name)
        return u is not None and u.team


@dataclass
class Verdict:
    """Admission of one request on one model: how, or why not (`never`: can never run as asked)."""

    admission: Admission | None
    reason: str = ""
    never: bool = False
    # Guaranteed, but a department on its path is at its borrowing limit (others below it borrowed
    # this quota): it reclaims borrowed shares instead of taking free GPUs beyond that limit.
    reclaim: bool = False


class Ledger:
    """One cycle's quota accounting: counted usage per (unit, bucket), the room per model, each
    team's deserved share; charged and refunded as the cycle decides."""

    def __init__(self, tree: QuotaTree, capacity: Mapping[str, Vec], shares: Iterable[tuple[Share, str, int]],
                 past: Mapping[str, float] | None = None) -> None:
        """`capacity`: model → what its GPUs can hold (ready GPUs, plus what counted shares hold on
        nodes that take nothing new). `shares`: (share, its GPU's model, how many GPUs of the
        reservation it stands for) for every held share. `past`: team → decayed past use (milli),
        added to its compute when ordering (off unless the caller passes it)."""
        self.tree = tree
        self.models = sorted(capacity)
        self.capacity = dict(capacity)
        self.used: dict[tuple[str, str], Vec] = defaultdict(lambda: ZERO)  # (unit, bucket) → counted use
        self.root_used: dict[str, Vec] = defaultdict(lambda: ZERO)  # model → counted use
        self.team_used: dict[tuple[str, str], Vec] = defaultdict(lambda: ZERO)  # (team, model) → counted use
        self.holdings: dict[str, tuple[str, str, Vec, Admission]] = {}  # reservation → team, model, amount, admission
        self.past = dict(past or {})
        self._kept: dict[tuple[str, str], Vec] = {}  # (parent, model) → unused quota its children keep
        self._kept_of: dict[tuple[str, str], Vec] = {}  # (unit, model) → its part of that
        # Verdicts and saturations are asked for again and again while the queue is ordered and
        # placed (per request and model, several times) but change only when the ledger does: a
        # verdict on model M reads the counted use of the units on the team's path for M, the
        # root's use of M and the siblings' reserve for M, so each is kept until a charge or refund
        # touches one of those (`_version[M]` moves); a saturation until the team's use of M moves.
        self._version: dict[str, int] = defaultdict(int)
        self._verdicts: dict[tuple[str, str, Vec, bool], tuple[int, Verdict]] = {}
        self._saturations: dict[tuple[str, str], dict[Vec, float]] = {}  # (team, model) → extra → saturation
        self._refunds: dict[tuple[str, str, Vec], tuple[int, tuple[Vec, Vec | None]]] = {}  # refund_needed's
        for share, model, gpus in shares:
            if share.team in tree.units and model in self.capacity:
                self._take(share.reservation_id, share.team, model, held_by(share, gpus), Admission(share.admission))
        self._init_kept()
        self.deserved: dict[tuple[str, str], Vec] = {}

    # ---- accounting ---------------------------------------------------------------------------
    def _take(self, rid: str, team: str, model: str, amount: Vec, admission: Admission) -> None:
        if rid in self.holdings:  # a multi-GPU reservation: one entry per GPU, summed
            t, m, before, adm = self.holdings[rid]
            self.holdings[rid] = (t, m, vec_add(before, amount), adm)
        else:
            self.holdings[rid] = (team, model, amount, admission)
        if admission not in COUNTED:
            return
        for unit, bucket in self.tree.path(team, model):
            self.used[(unit, bucket)] = vec_add(self.used[(unit, bucket)], amount)
        self.root_used[model] = vec_add(self.root_used[model], amount)
        self.team_used[(team, model)] = vec_add(self.team_used[(team, model)], amount)
        self._saturations.pop((team, model), None)

    def _init_kept(self) -> None:
        for name in self.tree.units:
            for model in self.models:
                self._update_kept(name, model)

    def _keeps(self, unit: str, bucket: str) -> Vec:
        q = self.tree.quota(unit, bucket)
        return _pos(_sub(_sub(q.vec(), self.used[(unit, bucket)]), q.lending.vec()))

    def _eparent(self, unit: str, model: str) -> str:
        p = self.tree.units[unit].parent
        while p != ROOT and self.tree.bucket(p, model) is None:
            p = self.tree.units[p].parent
        return p

    def _update_kept(self, unit: str, model: str) -> None:
        bucket = self.tree.bucket(unit, model)
        if bucket is None:
            return
        new = self._keeps(unit, bucket)
        key = (self._eparent(unit, model), model)
        old = self._kept_of.get((unit, model), ZERO)
        if new != old:
            self._kept_of[(unit, model)] = new
            self._kept[key] = vec_add(_sub(self._kept.get(key, ZERO), old), new)

    def charge(self, rid: str, team: str, model: str, amount: Vec, admission: Admission) -> None:
        if team not in self.tree.units:
            return  # a team the tree does not know: no quota policy, nothing to count (as in __init__)
        self._take(rid, team, model, amount, admission)
        if admission in COUNTED:
            self._touch(team, model)

    def refund(self, rid: str) -> None:
        found = self.holdings.pop(rid, None)
        if found is None:
            return
        team, model, amount, admission = found
        if admission not in COUNTED:
            return
        neg = vec_scale(amount, -1)
        for unit, bucket in self.tree.path(team, model):
            self.used[(unit, bucket)] = vec_add(self.used[(unit, bucket)], neg)
        self.root_used[model] = vec_add(self.root_used[model], neg)
        self.team_used[(team, model)] = vec_add(self.team_used[(team, model)], neg)
        self._saturations.pop((team, model), None)
        self._touch(team, model)

    def _touch(self, team: str, model: str) -> None:
        """Keep the siblings' reserve right for every model the changed buckets cover; the verdicts
        on those models are stale from now."""
        for unit, bucket in self.tree.path(team, model):
            for m in self.models:
                if self.tree.bucket(unit, m) == bucket:
                    self._update_kept(unit, m)
                    self._version[m] += 1
        self._version[model] += 1

    # ---- admission ----------------------------------------------------------------------------
    def verdict(self, team: str, model: str, amount: Vec, priority: int) -> Verdict:
        """How `team` would be admitted now for `amount` of `model` (see the module's text)."""
        key = (team, model, amount, priority == 0)
        version = self._version[model]
        found = self._verdicts.get(key)
        if found is not None and found[0] == version:
            return found[1]
        verdict = self.fresh_verdict(team, model, amount, priority)
        self._verdicts[key] = (version, verdict)
        return verdict

    def fresh_verdict(self, team: str, model: str, amount: Vec, priority: int) -> Verdict:
        """`verdict` worked out afresh, not from its cache (what the cache must agree with)."""
        unit = self.tree.units.get(team)
        if unit is None or not unit.team:
            return Verdict(Admission.GUARANTEED)  # a team the tree does not know: no quota policy for it
        path = self.tree.path(team, model)
        t_unit, t_bucket = path[0]
        quota = self.tree.quota(t_unit, t_bucket)
        used = self.used[(t_unit, t_bucket)]
        if vec_le(vec_add(used, amount), quota.vec()):
            # Within its own quota; but when others below a department borrowed what it lent, taking
            # free GPUs would pass that department's borrowing limit: then it takes its quota back.
            over = self.beyond_limit(path, amount)
            if over is None:
                return Verdict(Admission.GUARANTEED)
            u, b, r = over
            cap, held = self.tree.quota(u, b), self.used[(u, b)]
            cap_vec = vec_add(cap.vec(), cap.borrowing.vec())
            why = (f"{team} holds {amount_text(used, r)} of its {amount_text(quota.vec(), r)} "
                   f"{model if t_bucket == model else f'any-model ({WILDCARD})'} quota, lent to others now: "
                   f"{self._who(u)} is at its borrowing limit ({amount_text(held, r)} of {amount_text(cap_vec, r)}) "
                   f"until their borrowed shares go back")
            return Verdict(Admission.GUARANTEED, why, reclaim=True)
        opportunistic = priority == 0 and unit.allow_over_quota
        # A hard limit: the request alone is beyond quota + borrowing limit somewhere on its path.
        for u, b in path:
            q = self.tree.quota(u, b)
            cap = vec_add(q.vec(), q.borrowing.vec())
            if not vec_le(amount, cap):
                r = next(i for i in range(3) if amount[i] > cap[i])
                why = (f"it needs {amount_text(amount, r)} {RESOURCE_WORDS[r]} of {model}; {self._who(u)} may hold "
                       f"at most {amount_text(cap, r)} (quota {amount_text(q.vec(), r)} + borrowing limit "
                       f"{amount_text(q.borrowing.vec(), r)})")
                if opportunistic:
                    return Verdict(Admission.OPPORTUNISTIC, why)
                return Verdict(None, why, never=True)
        room = self._room(path, model)
        if vec_le(amount, room):
            return Verdict(Admission.BORROWED)
        if opportunistic:
            return Verdict(Admission.OPPORTUNISTIC)
        return Verdict(None, self._wait_reason(path, model, amount, room))

    def refund_needed(self, team: str, model: str, amount: Vec) -> tuple[Vec, Vec | None]:
        """What must be given back before `team` could be admitted for `amount` of `model` as
        guaranteed without `reclaim` (the first vector), or as borrowed (the second; None: never, a
        hard limit): a refund of r, where no unit's use of any bucket and no model's use falls by
        more than r per resource (and nothing is charged), can only admit it where r is at least
        one of them in every resource. A bound of `verdict` after such refunds: its room grows by
        at most r at each term, and the siblings' reserve it subtracts only grows when their use
        falls, so it is taken as it stands now. Rules out a preemption search whose every outcome
        would fail its admission check."""
        key = (team, model, amount)
        version = self._version[model]  # it reads what a verdict on `model` reads
        found = self._refunds.get(key)
        if found is not None and found[0] == version:
            return found[1]
        needed = self._refund_needed(team, model, amount)
        self._refunds[key] = (version, needed)
        return needed

    def _refund_needed(self, team: str, model: str, amount: Vec) -> tuple[Vec, Vec | None]:
        unit = self.tree.units.get(team)
        if unit is None or not unit.team:
            return (-INF, -INF, -INF), (-INF, -INF, -INF)  # a team the tree does not know: guaranteed
        path = self.tree.path(team, model)
        t_unit, t_bucket = path[0]
        # Guaranteed: used - r + amount within the team's quota and every limit above it.
        guaranteed = _sub(vec_add(self.used[(t_unit, t_bucket)], amount), self.tree.quota(t_unit, t_bucket).vec())
        caps = []
        for u, b in path:
            q = self.tree.quota(u, b)
            caps.append(vec_add(q.vec(), q.borrowing.vec()))
        for (u, b), cap in zip(path[1:], caps[1:], strict=True):
            guaranteed = _max(guaranteed, _sub(vec_add(self.used[(u, b)], amount), cap))
        if not all(vec_le(amount, cap) for cap in caps):
            return guaranteed, None  # beyond a hard limit: opportunistic or never, whatever is given back
        # Borrowed: `_room` + r at least amount. Top down, room = min(max(A + r, 0) - all siblings'
        # reserve, each unit's limit + r - the reserve below it).
        keeps: list[Vec] = []
        parent = ROOT
        for u, _ in reversed(path):
            keeps.append(_sub(self._kept.get((parent, model), ZERO), self._kept_of.get((u, model), ZERO)))
            parent = u
        below = ZERO
        borrowed = (-INF, -INF, -INF)
        for (u, b), cap, keep in zip(path, caps, reversed(keeps), strict=True):  # bottom up
            borrowed = _max(borrowed, vec_add(_sub(amount, _sub(cap, self.used[(u, b)])), below))
            below = vec_add(below, keep)
        top = _sub(vec_add(amount, below), _sub(self.capacity.get(model, ZERO), self.root_used[model]))
        at_least = vec_add(amount, below)
        borrowed = _max(borrowed, tuple(top[r] if at_least[r] > 0 else -INF for r in range(3)))
        return guaranteed, borrowed

    def beyond_limit(self, path: tuple[tuple[str, str], ...], amount: Vec) -> tuple[str, str, int] | None:
        """The first unit above the team on `path` that `amount` more would take beyond its quota +
        borrowing limit, its bucket and the resource; None when none."""
        for u, b in path[1:]:
            q = self.tree.quota(u, b)
            after = vec_add(self.used[(u, b)], amount)
            cap = vec_add(q.vec(), q.borrowing.vec())
            if not vec_le(after, cap):
                return u, b, next(i for i in range(3) if after[i] > cap[i])
        return None

    def excess(self, path: tuple[tuple[str, str], ...], amount: Vec) -> list[float]:
        """How far `amount` more would take each unit above the team on `path` beyond its quota +
        borrowing limit, per resource (0 where within)."""
        out: list[float] = []
        for u, b in path[1:]:
            q = self.tree.quota(u, b)
            after, cap = vec_add(self.used[(u, b)], amount), vec_add(q.vec(), q.borrowing.vec())
            out.extend(max(0, after[r] - cap[r]) for r in range(3))
        return out

    def _room(self, path: tuple[tuple[str, str], ...], model: str) -> Vec:
        """How much more the team at path[0] may hold of `model` now, quota and borrowing included."""
        room = _pos(_sub(self.capacity.get(model, ZERO), self.root_used[model]))
        parent = ROOT
        for unit, bucket in reversed(path):
            siblings_keep = _sub(self._kept.get((parent, model), ZERO), self._kept_of.get((unit, model), ZERO))
            room = _sub(room, siblings_keep)
            q = self.tree.quota(unit, bucket)
            room = _min(room, _sub(vec_add(q.vec(), q.borrowing.vec()), self.used[(unit, bucket)]))
            parent = unit
        return room

    def _who(self, unit: str) -> str:
        return f"team {unit}" if self.tree.is_team(unit) else unit.removeprefix("department:")

    def _wait_reason(self, path, model: str, amount: Vec, room: Vec) -> str:
        team, bucket = path[0]
        q = self.tree.quota(team, bucket)
        used = self.used[(team, bucket)]
        r = next((i for i in range(3) if used[i] + amount[i] > q.vec()[i]), 0)
        what = model if bucket == model else f"any-model ({WILDCARD})"
        head = (f"{team} holds {amount_text(used, r)} of its {amount_text(q.vec(), r)} {what} "
                f"{'GPU share' if r == 0 else RESOURCE_WORDS[r]} quota and this needs {amount_text(amount, r)}")
        r2 = next((i for i in range(3) if amount[i] > room[i]), r)
        for u, b in path:
            qq = self.tree.quota(u, b)
            cap = vec_add(qq.vec(), qq.borrowing.vec())
            if self.used[(u, b)][r2] + amount[r2] > cap[r2]:
                return (f"{head}; {self._who(u)} is at its borrowing limit "
                        f"({amount_text(self.used[(u, b)], r2)} of {amount_text(cap, r2)})")
        free = amount_text(_pos(room), r2) + ("" if r2 == 1 else " GPU share" if r2 == 0 else " GPUs")
        return f"{head}; others lend only {free} of {model} now (it waits for their use to end or quota to free)"

    def best(self, req: Request, models: Sequence[str]) -> dict[Admission | None, list[str]]:
        """The request's models grouped by admission (None: waits), and the verdicts' reasons."""
        out: dict[Admission | None, list[str]] = {}
        amount = demand_of(req)
        for m in models:
            out.setdefault(self.verdict(req.team, m, amount, req.priority).admission, []).append(m)
        return out

    # ---- fair share ---------------------------------------------------------------------------
    def deserve(self, pending: Sequence[Request]) -> None:
        """Work out each team's deserved share per model from what it holds and what waits."""
        self.deserved = self._deserve(pending)
        self._saturations.clear()

    def _deserve(self, pending: Sequence[Request]) -> dict[tuple[str, str], Vec]:
        demand: dict[tuple[str, str], Vec] = defaultdict(lambda: ZERO)
        for (team, model), v in self.team_used.items():
            demand[(team, model)] = vec_add(demand[(team, model)], v)
        for req in pending:
            if req.team not in self.tree.units:
                continue
            models = [m for m in self.models if req.gpu_model is None or m in req.gpu_model]
            amount = demand_of(req)
            for m, part in self._split(req.team, models).items():
                demand[(req.team, m)] = vec_add(demand[(req.team, m)], vec_scale(amount, part))
        out: dict[tuple[str, str], Vec] = {}
        children: dict[tuple[str, str], list[str]] = defaultdict(list)
        for model in self.models:
            for name in self.tree.units:
                if self.tree.bucket(name, model) is not None:
                    children[(self._eparent(name, model), model)].append(name)
        for model in self.models:
            subtree: dict[str, Vec] = defaultdict(lambda: ZERO)
            for (team, m), v in demand.items():
                if m != model:
                    continue
                for unit, _ in self.tree.path(team, model):
                    subtree[unit] = vec_add(subtree[unit], v)
            self._fill(ROOT, model, self.capacity[model], children, subtree, out)
        return out

    def _split(self, team: str, models: Sequence[str]) -> dict[str, float]:
        """How a waiting request that may use any of `models` counts as demand on each: in
        proportion to the team's compute quota there, or to the models' capacity where it has none
        on any. Counted once in all: a team cannot deserve more than it asks for."""
        if len(models) == 1:
            return {models[0]: 1.0}
        weights = {m: self.tree.quota(*self.tree.path(team, m)[0]).milli for m in models}
        if not sum(weights.values()):
            weights = {m: self.capacity[m][0] for m in models}
        total = sum(weights.values())
        if not total:
            return {m: 1.0 / len(models) for m in models} if models else {}
        return {m: w / total for m, w in weights.items() if w}

    def _fill(self, parent: str, model: str, share: Vec, children, subtree, out) -> None:
        kids = [c for c in children.get((parent, model), ()) if subtree.get(c, ZERO) != ZERO]
        if not kids:
            return
        quotas = {c: self.tree.quota(c, self.tree.bucket(c, model)) for c in kids}
        first = {c: _min(quotas[c].vec(), subtree[c]) for c in kids}
        left = _pos(_sub(share, _sum(first.values())))
        unmet = {c: _pos(_sub(subtree[c], first[c])) for c in kids}
        extra = _water_fill(left, {c: v for c, v in unmet.items() if v != ZERO},
                            {c: quotas[c].weight for c in kids},
                            {c: _pos(_sub(vec_add(quotas[c].vec(), quotas[c].borrowing.vec()), first[c]))
                             for c in kids})
        for c in kids:
            got = vec_add(first[c], extra.get(c, ZERO))
            if self.tree.units[c].team:
                out[(c, model)] = got
            else:
                self._fill(c, model, got, children, subtree, out)

    def saturation(self, team: str, model: str, extra: Vec = ZERO) -> float:
        """max over compute and memory of (used + extra) / deserved; past use adds to compute."""
        known = self._saturations.setdefault((team, model), {})
        found = known.get(extra)
        if found is None:
            found = known[extra] = self._saturation(team, model, extra)
        return found

    def _saturation(self, team: str, model: str, extra: Vec) -> float:
        used = vec_add(self.team_used[(team, model)], extra)
        deserved = self.deserved.get((team, model), ZERO)
        past = self.past.get(team, 0.0)
        worst = 0.0
        for r in (0, 1):
            u = used[r] + (past if r == 0 else 0.0)
            if u <= 0:
                continue
            worst = max(worst, u / deserved[r] if deserved[r] > 0 else INF)
        return worst


def _sum(vs: Iterable[Vec]) -> Vec:
    out = ZERO
    for v in vs:
        out = vec_add(out, v)
    return out


def _water_fill(left: Vec, unmet: Mapping[str, Vec], weight: Mapping[str, float], cap: Mapping[str, Vec]
                ) -> dict[str, Vec]:
    """Split `left` among children with unmet demand by weight, along each one's demand vector,
    equalising weighted dominant shares (the larger of compute and memory as a fraction of `left`)."""
    if not unmet:
        return {}
    # Each child grows along its unmet vector: fraction f of it, f ≤ its cap. Its dominant share at
    # f is f * dom; water-filling raises a level λ and gives f = min(top, λ * weight / dom).
    dom: dict[str, float] = {}
    top: dict[str, float] = {}
    for c, u in unmet.items():
        fractions = [u[r] / left[r] for r in (0, 1) if left[r] > 0 and u[r] > 0]
        dom[c] = max(fractions) if fractions else 0.0
        limit = 1.0
        for r in range(3):
            if u[r] > 0:
                # Nothing left of a resource it needs: it gets nothing more (without this its
                # dominant share read 0 and it got all it asked for, beyond the capacity).
                limit = min(limit, cap[c][r] / u[r] if left[r] > 0 else 0.0)
        top[c] = max(0.0, limit)

    def taken(level: float) -> Vec:
        total = ZERO
        for c, u in unmet.items():
            f = top[c] if dom[c] == 0 else min(top[c], level * weight[c] / dom[c])
            total = vec_add(total, vec_scale(u, f))
        return total

    if vec_le(taken(1e12), left):  # everyone's unmet demand fits
        level = 1e12
    else:
        lo, hi = 0.0, 1.0
        while vec_le(taken(hi), left) and hi < 1e12:
            hi *= 2
        for _ in range(50):
            mid = (lo + hi) / 2
            if vec_le(taken(mid), left):
                lo = mid
            else:
                hi = mid
        level = lo
    return {c: vec_scale(u, top[c] if dom[c] == 0 else min(top[c], level * weight[c] / dom[c]))
            for c, u in unmet.items()}


@dataclass(frozen=True)
class Standing:
    """Where one unit stands in one bucket now: its quota, what its subtree holds that counts
    (guaranteed + borrowed), how much of that is beyond its quota (borrowed from others), and how
    much of its unused quota others hold (lent). Vectors: (compute milli, memory MiB, GPUs)."""

    unit: str
    bucket: str
    quota: Vec
    used: Vec
    borrowed: Vec
    lent: Vec


def standings(ledger: Ledger) -> list[Standing]:
    """Every unit's standing in every bucket it has a row for (teams: also where they hold something).
    Lent: under each parent, what the children hold beyond their quotas is taken from the siblings'
    unused quota (up to each one's lending limit) in proportion to it, then from the parent's own
    room; so the lent amounts of a parent's children add up to what their siblings borrowed there,
    as far as unused quota covers it."""
    tree = ledger.tree
    keys: set[tuple[str, str]] = set()
    for name, unit in tree.units.items():
        keys.update((name, b) for b in unit.quotas)
    keys.update(k for k, v in ledger.used.items() if v != ZERO)
    out: dict[tuple[str, str], Standing] = {}
    for unit, bucket in keys:
        q = tree.quota(unit, bucket).vec()
        used = ledger.used[(unit, bucket)]
        out[(unit, bucket)] = Standing(unit, bucket, q, used, _pos(_sub(used, q)), ZERO)
    # Group siblings per (effective parent, model the bucket covers): a bucket is lent within the
    # group of each model it covers; `*` buckets are grouped under their own name.
    groups: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for unit, bucket in keys:
        model = bucket if bucket != WILDCARD else WILDCARD
        parent = ledger._eparent(unit, model) if model != WILDCARD else tree.units[unit].parent
        groups[(parent, bucket)].append((unit, bucket))
    for members in groups.values():
        borrowed = _sum(out[k].borrowed for k in members)
        if borrowed == ZERO:
            continue
        spare = {k: _min(_pos(_sub(out[k].quota, out[k].used)), tree.quota(*k).lending.vec()) for k in members}
        total = _sum(spare.values())
        for k, s in spare.items():
            share = tuple(min(s[r], borrowed[r] * s[r] / total[r]) if total[r] > 0 else 0 for r in range(3))
            st = out[k]
            out[k] = Standing(st.unit, st.bucket, st.quota, st.used, st.borrowed, share)  # type: ignore[arg-type]
    return sorted(out.values(), key=lambda s: (s.unit, s.bucket))
