"""Usage reports: GPU time allocated versus really used, grouped by team, user, node, GPU model,
GPU or reservation, for the teams a user may see (see scope.py).

- Allocated GPU-hours come from the allocation rows: share × the part of [created, released) inside
  the window (an allocation still held counts up to now). A share of 0.5 for 2 hours is 1.
- Used GPU-hours, idle allocated GPU-hours and burst come from the telemetry rollups (sources.py).
  Idle: allocated time in minutes whose measured use was under the team's idle threshold (minutes
  without measurements are not idle, as the lifecycle's idle detection judges). Burst: use above
  the share's request, which a share may reach (up to its limit) while the GPU has spare time; it
  is why used can exceed allocated.
- Pods left to the default kube-scheduler that name our DeviceClasses hold GPUs through claims it
  allocated (placement/foreign_claims.py keeps each as a `ForeignHold`, from the housekeeping run
  that first saw it to the first that no longer did): their share × that time counts as allocated
  GPU-hours (and `kube_scheduler_gpu_hours`) of the claim's namespace's team, or, where the
  namespace belongs to no team, of the "(unattributed)" row site admins see. They are not
  reservations: the reservation grouping leaves them out, and no telemetry is matched to them.
- Borrowed GPU-hours: the allocated time of reservations admitted as borrowed (beyond their team's
  quota, on what others lend; reclaimable). Opportunistic GPU-hours: of those that ran on idle
  capacity at priority 0, counted in no quota.
- Quota and lent GPU-hours, per team (and per department when grouped by department): fairshare.py
  says how they are counted.
- Device busy hours (the GPU's own SM load, every team's work on it) only for site admins.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from django.db.models import Q
from django.utils import timezone

from portal.fleet.models import Gpu, gpus_name
from portal.placement.models import ForeignHold
from portal.reservations import engine_quotas
from portal.reservations.models import Admission, Allocation, Reservation
from portal.tenancy.models import Team

from . import bookings as booking_hours
from . import fairshare, sources
from .window import Window, spread

GROUPS = ("team", "department", "user", "node", "gpu_model", "gpu", "reservation")
DEVICE_GROUPS = ("node", "gpu_model", "gpu")
TOP_IDLE = 10
UNATTRIBUTED = "(unattributed)"  # the row of kube-scheduler claims in namespaces of no team (no slug has brackets)
UNATTRIBUTED_LABEL = "unattributed (kube-scheduler pods in namespaces of no team)"
KUBE_SCHEDULER = "(kube-scheduler)"  # grouped by user: those pods have no portal user


@dataclass
class Row:
    key: str
    label: str = ""
    allocated_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    idle_allocated_gpu_hours: float = 0.0
    burst_gpu_hours: float = 0.0
    borrowed_gpu_hours: float = 0.0  # held beyond the team's quota, from what others lent
    opportunistic_gpu_hours: float = 0.0
    kube_scheduler_gpu_hours: float = 0.0  # of the allocated: held by kube-scheduler pods' claims
    device_busy_hours: float | None = None
    # Per team and department only (None on the other groupings): fairshare.py.
    quota_gpu_hours: float | None = None
    lent_gpu_hours: float | None = None
    department: str = ""  # a team's departments from the top ("Research › Language")
    # Grouped by reservation: who and what it is, one field each (id, name, owner, team, the GPU
    # models it held, when it started and ended), for the CSV's columns and the JSON alike.
    reservation: dict | None = None

    def add(self, other: Row) -> None:
        for name in ("allocated_gpu_hours", "used_gpu_hours", "idle_allocated_gpu_hours", "burst_gpu_hours",
                     "borrowed_gpu_hours", "opportunistic_gpu_hours", "kube_scheduler_gpu_hours"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("device_busy_hours", "quota_gpu_hours", "lent_gpu_hours"):
            if getattr(other, name) is not None:
                setattr(self, name, (getattr(self, name) or 0.0) + getattr(other, name))

    @property
    def used_pct(self) -> float | None:
        if self.allocated_gpu_hours <= 0:
            return None
        return percent(self.used_gpu_hours, self.allocated_gpu_hours)

    @property
    def note(self) -> str:
        if self.used_pct is not None and self.used_pct > 100:
            return (f"used {self.used_pct:g} % of allocated: shares burst above their request (up to their "
                    f"limit) while the GPU had spare time, {self.burst_gpu_hours:.2f} GPU-h in all")
        return ""

    def as_dict(self) -> dict:
        return {"key": self.key, "label": self.label or self.key,
                "allocated_gpu_hours": _r(self.allocated_gpu_hours), "used_gpu_hours": _r(self.used_gpu_hours),
                "used_pct": self.used_pct, "idle_allocated_gpu_hours": _r(self.idle_allocated_gpu_hours),
                "burst_gpu_hours": _r(self.burst_gpu_hours),
                "borrowed_gpu_hours": _r(self.borrowed_gpu_hours),
                "opportunistic_gpu_hours": _r(self.opportunistic_gpu_hours),
                "kube_scheduler_gpu_hours": _r(self.kube_scheduler_gpu_hours),
                "quota_gpu_hours": None if self.quota_gpu_hours is None else _r(self.quota_gpu_hours),
                "lent_gpu_hours": None if self.lent_gpu_hours is None else _r(self.lent_gpu_hours),
                "department": self.department,
                "device_busy_hours": None if self.device_busy_hours is None else _r(self.device_busy_hours),
                "note": self.note} | ({"reservation": self.reservation} if self.reservation is not None else {})


def _r(x: float) -> float:
    return round(x, 4)


def percent(part: float, whole: float) -> float:
    """One decimal, half up, after dropping float noise: 47.25 % is 47.3 % whichever order the
    minutes were summed in (hours and minutes must give the same answer)."""
    exact = Decimal(repr(round(100.0 * part / whole, 9)))
    return float(exact.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


@dataclass
class Report:
    group_by: str
    window: Window
    teams: list[Team]
    rows: list[Row]
    total: Row
    series: dict  # {"edges": [...], "teams": {slug: {"allocated": [...], "used": [...]}}}
    top_idle: list[dict] = field(default_factory=list)
    device_load_shown: bool = False
    bookings: list[dict] = field(default_factory=list)  # per team (reports/bookings.py)

    def as_dict(self) -> dict:
        return {
            "group_by": self.group_by, "since": self.window.since, "until": self.window.until,
            "time_zone": str(self.window.tz), "teams": [t.slug for t in self.teams],
            "units": "GPU-hours: a share of 0.5 held for 2 hours is 1 GPU-hour",
            "quota_rule": fairshare.QUOTA_RULE, "lent_rule": fairshare.LENT_RULE,
            "rows": [r.as_dict() for r in self.rows], "total": self.total.as_dict(),
            "series": self.series, "top_idle": self.top_idle,
            "bookings": self.bookings, "bookings_rule": booking_hours.RULE,
        }


@dataclass(frozen=True)
class _Res:
    team: str
    owner: str
    name: str
    admission: str
    state: str
    started_at: datetime | None = None  # running (else placed) since
    finished_at: datetime | None = None


def _reservation_key(group_by: str, res: _Res, rid: int, gpu: tuple[str, str, str, int] | None) -> tuple[str, str]:
    """(key, label) of the row a reservation's share on a GPU (node, model, uuid, index) adds to. A
    GPU's row is keyed by its UUID and labelled as a person reads it ("GPU 0 on t4-node-1 (T4)")."""
    if group_by == "team":
        return res.team, res.team
    if group_by == "user":
        return res.owner, res.owner
    if group_by == "reservation":
        return str(rid), f"{res.name or '#' + str(rid)} ({res.owner}, {res.team})"
    node, model, uuid, index = gpu or ("?", "?", "?", "?")
    key = {"node": node, "gpu_model": model, "gpu": uuid}[group_by]
    return key, (gpus_name([index], node, model) if group_by == "gpu" else key)


def usage(user, group_by: str, window: Window, teams: list[Team]) -> Report:
    if group_by not in GROUPS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}")
    report = _usage(user, "team" if group_by == "department" else group_by, window, teams)
    _quota_columns(report, group_by)
    report.bookings = booking_hours.per_team(window, teams)
    return report


def _quota_columns(report: Report, group_by: str) -> None:
    """Quota and lent GPU-hours of the teams (their rows, or the total on other groupings), and with
    group_by=department the rows become the departments (fairshare.py)."""
    now = timezone.now()
    tree = fairshare.Tree.load()
    hours = fairshare.effective_hours(report.window.since, report.window.until, now)
    lent = fairshare.lent_hours(report.window.since, report.window.until, now)
    quota = {t.slug: tree.quota_share(t.slug) * hours for t in report.teams}
    total_quota = sum(quota.values())
    total_lent = sum(lent.get(t.slug, 0.0) for t in report.teams)
    by_team = {r.key: r for r in report.rows} if report.group_by == "team" else {}
    if report.group_by == "team":
        # Every team in scope has its row: one that held nothing in the window is listed with zeros
        # (its quota, and what it lent, where it had any), not left out as if it did not exist.
        for t in sorted(report.teams, key=lambda t: t.slug):
            if t.slug not in by_team:
                by_team[t.slug] = Row(key=t.slug, label=t.slug)
                report.rows.append(by_team[t.slug])
    for slug, r in by_team.items():
        r.quota_gpu_hours, r.lent_gpu_hours = quota.get(slug, 0.0), lent.get(slug, 0.0)
        r.department = tree.path_label(slug)
    if group_by == "department":
        report.rows = _department_rows(report, tree, hours, lent)
        report.group_by = "department"
    report.total.quota_gpu_hours, report.total.lent_gpu_hours = total_quota, total_lent


NO_DEPARTMENT = "(no department)"


def _department_rows(report: Report, tree: fairshare.Tree, hours: float, lent: dict[str, float]) -> list[Row]:
    """One row per department above the report's teams (its teams' allocated, used, idle, burst,
    borrowed and opportunistic hours; its own quota and lent hours), in tree order, and one for the
    teams directly under the organisation. Departments nest: their rows overlap, the total does not."""
    rows: dict[str, Row] = {}
    for team in report.rows:
        for unit in ([UNATTRIBUTED] if team.key == UNATTRIBUTED else tree.ancestors(team.key) or [""]):
            if unit not in rows:
                label = (team.label if unit == UNATTRIBUTED else tree.labels.get(unit, unit) if unit
                         else NO_DEPARTMENT)
                rows[unit] = Row(key=unit.removeprefix(engine_quotas.DEPARTMENT) if unit else "",
                                 label=label, quota_gpu_hours=0.0 if unit in ("", UNATTRIBUTED)
                                 else tree.quota_share(unit) * hours,
                                 lent_gpu_hours=0.0 if unit in ("", UNATTRIBUTED) else tree.lent(unit, lent),
                                 department=tree.path_label(unit) if unit else "")
            rows[unit].add(Row(key=team.key, allocated_gpu_hours=team.allocated_gpu_hours,
                               used_gpu_hours=team.used_gpu_hours,
                               idle_allocated_gpu_hours=team.idle_allocated_gpu_hours,
                               burst_gpu_hours=team.burst_gpu_hours, borrowed_gpu_hours=team.borrowed_gpu_hours,
                               opportunistic_gpu_hours=team.opportunistic_gpu_hours,
                               kube_scheduler_gpu_hours=team.kube_scheduler_gpu_hours,
                               quota_gpu_hours=0.0 if unit else team.quota_gpu_hours,
                               lent_gpu_hours=0.0 if unit else team.lent_gpu_hours))

    def order(unit: str) -> tuple:
        return (unit == "", [tree.labels.get(d, d) for d in reversed([unit, *tree.ancestors(unit)])])

    return [rows[u] for u in sorted(rows, key=order)]


def _usage(user, group_by: str, window: Window, teams: list[Team]) -> Report:
    team_ids = [t.pk for t in teams]
    slugs = {t.pk: t.slug for t in teams}
    now = timezone.now()
    edges = window.edges()
    rows: dict[str, Row] = {}
    per_reservation: dict[int, Row] = defaultdict(lambda: Row(key=""))

    def row(key: str, label: str) -> Row:
        if key not in rows:
            rows[key] = Row(key=key, label=label)
        return rows[key]

    allocations = list(
        Allocation.objects.filter(Q(released_at__isnull=True) | Q(released_at__gt=window.since),
                                  created_at__lt=window.until, reservation__team_id__in=team_ids)
        .values_list("reservation_id", "gpu_id", "gpu_request", "created_at", "released_at"))
    shares = sources.share_sums(window.since, window.until, team_ids, ("reservation_id", "gpu_id"))
    rids = {a[0] for a in allocations} | {k[0] for k in shares}
    # Not reservations: left out of a report by reservation. No team's: only site admins see them.
    holds = [] if group_by == "reservation" else list(
        ForeignHold.objects.filter(Q(released_at__isnull=True) | Q(released_at__gt=window.since),
                                   (Q(team_id__in=team_ids) | Q(team__isnull=True)) if user.is_staff
                                   else Q(team_id__in=team_ids), created_at__lt=window.until)
        .values_list("team_id", "gpu_id", "gpu_request", "created_at", "released_at", "node_name", "gpu_index"))
    gpu_ids = {a[1] for a in allocations} | {k[1] for k in shares} | {h[1] for h in holds if h[1] is not None}
    info = _reservations(rids, slugs)
    gpus = {}
    if group_by in DEVICE_GROUPS:  # only these rows are keyed by the GPU
        gpus = {g[0]: g[1:] for g in Gpu.objects.filter(pk__in=gpu_ids)
                .values_list("pk", "node__name", "model", "uuid", "index")}
    series = {slugs[t]: {"allocated": [0.0] * (len(edges) - 1), "used": [0.0] * (len(edges) - 1)} for t in team_ids}

    for rid, gpu_id, share, created, released in allocations:
        start, end = max(created, window.since), min(released or now, window.until, now)
        held = max(0.0, (end - start).total_seconds()) / 3600.0
        if held <= 0:
            continue
        res = info[rid]
        r = row(*_reservation_key(group_by, res, rid, gpus.get(gpu_id)))
        r.allocated_gpu_hours += float(share) * held
        per_reservation[rid].allocated_gpu_hours += float(share) * held
        if res.admission == Admission.OPPORTUNISTIC:
            r.opportunistic_gpu_hours += float(share) * held
        elif res.admission == Admission.BORROWED:
            r.borrowed_gpu_hours += float(share) * held
        for i, v in enumerate(spread(edges, start, end, float(share))):
            series[res.team]["allocated"][i] += v

    for team_id, gpu_id, share, created, released, node, index in holds:
        start, end = max(created, window.since), min(released or now, window.until, now)
        held = max(0.0, (end - start).total_seconds()) / 3600.0
        if held <= 0:
            continue
        team = slugs.get(team_id)
        if group_by == "team":
            key, label = (team, team) if team else (UNATTRIBUTED, UNATTRIBUTED_LABEL)
        elif group_by == "user":
            key, label = KUBE_SCHEDULER, "kube-scheduler pods (DRA claims)"
        else:
            key, label = _reservation_key(group_by, _Res(team=team or "", owner="", name="", admission="", state=""),
                                          0, gpus.get(gpu_id) or (node, "?", f"{node}/gpu-{index}", index))
        r = row(key, label)
        r.allocated_gpu_hours += float(share) * held
        r.kube_scheduler_gpu_hours += float(share) * held
        if team:
            for i, v in enumerate(spread(edges, start, end, float(share))):
                series[team]["allocated"][i] += v

    for (rid, gpu_id), m in shares.items():
        res = info[rid]
        r = row(*_reservation_key(group_by, res, rid, gpus.get(gpu_id)))
        r.used_gpu_hours += m["used"] / 60.0
        r.idle_allocated_gpu_hours += m["idle_allocated"] / 60.0
        r.burst_gpu_hours += m["over_request"] / 60.0
        per_reservation[rid].idle_allocated_gpu_hours += m["idle_allocated"] / 60.0

    for (team_id, bucket), m in sources.share_sums(window.since, window.until, team_ids, ("team_id", "bucket"),
                                                   edges).items():
        series[slugs[team_id]]["used"][bucket] += m["used"] / 60.0

    device_shown = user.is_staff and group_by in DEVICE_GROUPS
    if device_shown:
        key = {"node": "gpu__node__name", "gpu_model": "gpu__model", "gpu": "gpu__uuid"}[group_by]
        busy_of = sources.gpu_busy(window.since, window.until, key)
        names = {}  # a busy GPU that held none of these teams' shares: its row still names it for people
        if group_by == "gpu":
            names = {uuid: gpus_name([index], node, model) for uuid, index, node, model in Gpu.objects.filter(
                uuid__in=set(busy_of) - set(rows)).values_list("uuid", "index", "node__name", "model")}
        for k, busy in busy_of.items():
            (rows.get(k) or row(k, names.get(k, k))).device_busy_hours = busy / 60.0
        for r in rows.values():
            r.device_busy_hours = r.device_busy_hours or 0.0

    if group_by == "reservation":
        _describe_reservations(rows, info, {(a[1], a[0]) for a in allocations} | {(g, rid) for rid, g in shares})
    total = Row(key="total", label="Total", device_busy_hours=0.0 if device_shown else None)
    for r in rows.values():
        total.add(r)
    ordered = sorted(rows.values(), key=lambda r: (-r.allocated_gpu_hours, r.key))
    return Report(group_by=group_by, window=window, teams=teams, rows=ordered, total=total,
                  series={"edges": edges, "bucket_hours": window.bucket_hours,
                          "teams": {k: {n: [_r(x) for x in v] for n, v in s.items()} for k, s in series.items()}},
                  top_idle=_top_idle(per_reservation, info), device_load_shown=device_shown)


def _reservations(ids: set[int], slugs: dict[int, str]) -> dict[int, _Res]:
    return {pk: _Res(team=slugs[team_id], owner=owner, name=name, admission=admission, state=state,
                     started_at=started or placed, finished_at=finished)
            for pk, team_id, owner, name, admission, state, started, placed, finished
            in Reservation.objects.filter(pk__in=ids).values_list(
                "pk", "team_id", "owner__username", "name", "admission", "state", "started_at", "placed_at",
                "finished_at")}


def _describe_reservations(rows: dict[str, Row], info: dict[int, _Res], gpu_of: set[tuple[int, int]]) -> None:
    """Grouped by reservation: each row's reservation, one field each. `gpu_of`: (GPU id, reservation
    id) of the shares counted (the models it held, not only the one it asked for)."""
    model_of = dict(Gpu.objects.filter(pk__in={g for g, _ in gpu_of}).values_list("pk", "model"))
    models: dict[int, set[str]] = defaultdict(set)
    for gpu_id, rid in gpu_of:
        models[rid].add(model_of.get(gpu_id, "?"))
    for key, r in rows.items():
        rid = int(key)
        res = info[rid]
        r.reservation = {"id": rid, "name": res.name, "owner": res.owner, "team": res.team,
                         "gpu_model": ", ".join(sorted(models[rid])), "state": res.state,
                         "started_at": res.started_at, "finished_at": res.finished_at}


def _top_idle(per_reservation: dict[int, Row], info: dict[int, _Res]) -> list[dict]:
    idle = sorted(((r.idle_allocated_gpu_hours, rid) for rid, r in per_reservation.items()
                   if r.idle_allocated_gpu_hours > 0), reverse=True)[:TOP_IDLE]
    out = []
    for hours, rid in idle:
        res, r = info[rid], per_reservation[rid]
        out.append({"reservation": rid, "name": res.name or f"#{rid}", "owner": res.owner, "team": res.team,
                    "state": res.state, "allocated_gpu_hours": _r(r.allocated_gpu_hours),
                    "idle_allocated_gpu_hours": _r(hours),
                    "idle_pct": percent(hours, r.allocated_gpu_hours) if r.allocated_gpu_hours else None})
    return out


def bucket_labels(edges: list[datetime], tz) -> list[str]:
    return [e.astimezone(tz).strftime("%Y-%m-%d %H:%M") for e in edges[:-1]]
