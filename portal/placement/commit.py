"""Commit a cycle's decisions in batches: one fence check, a few set-based queries and one COMMIT
for many. The first batch is small so that binding starts early; each next one is twice as large
(fewer round trips and bind tasks), up to BATCH_DECISIONS.

Each batch's transaction (1) passes the fence with the cycle's token and (2) goes through
`reservations.services.place_many`, which locks the GPU rows and re-checks their free capacity.
So no GPU is over-committed whatever runs concurrently, and a stale cycle cannot write. A gang's
members commit together: all of them or none. No cluster call is made here: after each commit
`on_bind` hands the placed reservations (and the pods of the ones they preempted, to delete first)
to the binding task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from django.db import transaction

from portal.fleet.models import gpus_name
from portal.reservations import actors, services
from portal.reservations.models import Admission, Reservation
from portal.reservations.states import IllegalTransition
from scheduler import core
from scheduler.core.remote import SharingChoice, SharingMode

from . import fleet_cache, snapshot
from .locking import Lease, fence

log = logging.getLogger(__name__)
MILLI = Decimal("0.001")
# Decisions per commit: the first batch, and the most. Bind tasks are sent at each commit, so a
# small batch lets a second worker start on the pods sooner; a large one costs fewer round trips
# and fewer bind tasks.
FIRST_BATCH = 25
BATCH_DECISIONS = 200

# A pod to delete before the batch's pods are made: (namespace, name, why), and for a reclaim
# warning the grace its processes get between SIGTERM and SIGKILL (seconds).
Eviction = tuple[str, str, str] | tuple[str, str, str, int]
# Called after each commit with the reservations it placed and the pods of those it preempted.
OnBind = Callable[[list[int], list[Eviction]], None]


@dataclass
class CycleReport:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    unschedulable: int = 0
    conflicts: int = 0
    looked_at: int = 0  # waiting reservations given to the engine (the rest were known not to fit)
    seconds: float = 0.0
    # Where the time went: reading the queue and the cluster, the engine, committing, the rest.
    phases: dict[str, float] = field(default_factory=dict)

    reclaiming: list[int] = field(default_factory=list)  # borrowed reservations warned this cycle

    def phase_text(self) -> str:
        return ", ".join(f"{name} {s:.3f}" for name, s in self.phases.items())


def _model_on(fleet: fleet_cache.Fleet, node: str, index: int) -> str:
    """The model of GPU `index` of `node`, as the snapshot knew it."""
    blank = fleet.nodes[fleet.position_of_node[fleet.node_ids[node]]].blank
    return next((g.model for g in blank.gpus if g.index == index), "")


def _placing(p: core.Placement, node_ids: dict[str, int], gpu_ids: dict[str, int],
             remote: SharingChoice | None = None, fleet: fleet_cache.Fleet | None = None) -> services.Placing:
    share = Decimal(str(p.gpu_request)).quantize(MILLI)
    allocations = tuple(services.NewAllocation(gpu_ids[u], share, p.gpu_memory_mib) for u in p.gpu_uuids)
    if remote is not None:
        return services.Placing(int(p.request_id), node_ids[p.node], allocations,
                                f"placed on {remote.pod_node}, using GPU {remote.gpu_index} of {p.node} remotely",
                                SharingMode.REMOTE, remote.reason, node_ids[remote.pod_node], p.admission)
    if p.gpu_request >= 1:
        mode = SharingMode.EXCLUSIVE
        why = f"{'whole GPUs' if len(p.gpu_indexes) > 1 else 'a whole GPU'} " \
              f"({', '.join(map(str, p.gpu_indexes))}) on {p.node}, where the pod runs"
    else:
        mode = SharingMode.LOCAL
        why = f"a {p.gpu_request:g} share of GPU {p.gpu_indexes[0]} on {p.node}, where the pod runs"
    model = _model_on(fleet, p.node, p.gpu_indexes[0]) if fleet is not None else ""
    held = {"borrowed": " (borrowed beyond the team's quota: may be reclaimed)",
            "opportunistic": " (opportunistic: on idle capacity, may be preempted)"}.get(p.admission, "")
    return services.Placing(int(p.request_id), node_ids[p.node], allocations,
                            f"placed on {gpus_name(p.gpu_indexes, p.node, model)}{held}", mode, why,
                            admission=p.admission)


def _evict(victim_id: int, by: snapshot.Pending, placed_as: str, report: CycleReport,
           evicted: list[Eviction]) -> None:
    """Preempt one victim of `by`, placed as `placed_as`: another team's borrowed share taken for a
    borrowed placement is a reclaim by fair share, for a guaranteed one a reclaim of lent quota."""
    pod = Reservation.objects.filter(pk=victim_id).values_list(
        "priority", "pod_namespace", "pod_name", "admission", "team__slug").first()
    if pod is None:
        return
    priority, namespace, name, admission, team = pod
    if admission == Admission.BORROWED and team != by.team_slug:
        why = "reclaimed: " + _reclaimed_for("fair_share" if placed_as == Admission.BORROWED else "quota", by)
    else:
        why = f"preempted by reservation {by.pk} (priority {by.priority} over {priority})"
    if not services.preempt(victim_id, why, actors.SCHEDULER):
        return
    if name:
        evicted.append((namespace, name, why))
    report.preempted.append(victim_id)


def _reclaimed_for(kind: str, by: snapshot.Pending) -> str:
    """Why a borrowed share is reclaimed for `by`, as its owner reads it (`core.Reclaim.kind`)."""
    if kind == "fair_share":
        return f"taken back for team {by.team_slug}, which is below its fair share (reservation {by.pk})"
    if kind == "node_hold":
        return (f"its node is being freed for reservation {by.pk} of team {by.team_slug}, which needs whole GPUs "
                f"on one node and is below its fair share or within its quota")
    return f"team {by.team_slug} needs the capacity it lent, within its quota (reservation {by.pk})"


class Batches:
    def __init__(self, lease: Lease, renew: Callable[[], bool], on_bind: OnBind,
                 rows: dict[str, snapshot.Pending], report: CycleReport) -> None:
        self.lease, self.renew, self.on_bind, self.rows, self.report = lease, renew, on_bind, rows, report
        self.units: list[tuple[list[core.Placement], tuple[str, ...]]] = []
        self.size = FIRST_BATCH
        self.waiting: dict[str, str] = {}  # request id → why it waits
        self.node_ids: dict[str, int] | None = None
        self.gpu_ids: dict[str, int] = {}
        self.fleet: fleet_cache.Fleet | None = None
        self.seconds = 0.0  # spent committing
        self.remote: dict[str, SharingChoice] = {}  # request id → its remote share (portal.placement.remote)
        self.reclaims: list[core.Reclaim] = []
        self.committed: list[core.Placement] = []  # what the commits placed (the forecast starts from them)

    def reclaim(self, decision: core.Reclaim) -> None:
        """A request waits while borrowed shares are reclaimed for it: warned in the next commit."""
        self.reclaims.append(decision)
        if decision.request_id in self.rows:  # a booking's is no waiting reservation
            self.waiting[decision.request_id] = "waiting for reclaimed capacity"  # made precise at commit

    def _warn(self, evicted: list[Eviction]) -> None:
        """Warn the victims of this batch's reclaims (once each: a warned one keeps its time), saying
        why they go (`Reclaim.kind`), and say in each request's reason when it can start (and which
        node is held for it)."""
        reclaims, self.reclaims = self.reclaims, []
        if not reclaims:
            return
        now = time.time()
        rows = {r.pk: r for r in Reservation.objects.filter(
            pk__in={int(v) for d in reclaims for v in d.victims}).select_related("team", "team__policy")}
        for d in reclaims:
            by = self.rows.get(d.request_id)  # None: a booked window ahead (kind "booking")
            hold = next((r.message for r in d.reasons if r.message.startswith("holding node")), "")
            if not d.due:  # a node held while work it may not take there ends: nothing to warn
                if by is not None:
                    self.waiting[d.request_id] = hold[:500]
                continue
            last = max(d.due.values())
            parts = []
            for victim, due in sorted(d.due.items(), key=lambda kv: kv[1]):
                r = rows.get(int(victim))
                if r is None:
                    continue
                if due > now and r.reclaim_at is None:
                    at = datetime.fromtimestamp(due, tz=UTC)
                    because = d.reasons[0].message if by is None else _reclaimed_for(d.kind, by)
                    why = (f"to be reclaimed at {at:%H:%M} UTC: {because}; save your work, the pod "
                           f"gets SIGTERM now")
                    admissions = services.FOR_A_BOOKING if d.kind == "booking" else (Admission.BORROWED,)
                    if services.warn_reclaim(r.pk, at, why, actors.SCHEDULER, admissions) is not None:
                        self.report.reclaiming.append(r.pk)
                        if r.pod_name:
                            evicted.append((r.pod_namespace, r.pod_name, why, max(0, round(due - now))))
                parts.append(f"reservation {r.pk} (team {r.team.slug})")
            if by is None:
                continue
            start = datetime.fromtimestamp(last, tz=UTC)
            because = "within its quota: capacity lent to others" if d.kind == "quota" else \
                "below its fair share: capacity others borrowed"
            self.waiting[d.request_id] = (f"{hold + '; ' if hold else ''}{because} is being reclaimed from "
                                          f"{', '.join(parts)}; it starts by about {start:%H:%M} UTC")[:500]

    def add(self, decision: tuple[core.Placement, ...] | core.Preemption) -> bool:
        """Queue a decision (a placement or a gang's placements, or a preemption); commits when
        the batch is full. False: the cycle lost its lease and must stop."""
        if isinstance(decision, core.Preemption):
            self.units.append(([decision.placement], decision.victims))
        else:
            self.units.append((list(decision), ()))
        if len(self.units) < self.size:
            return True
        self.size = min(2 * self.size, BATCH_DECISIONS)
        return self.commit()

    def commit(self) -> bool:
        started = time.perf_counter()
        try:
            return self._commit()
        finally:
            self.seconds += time.perf_counter() - started

    def _lost_race(self, placements: list[core.Placement], why: object) -> None:
        self.report.conflicts += 1
        for p in placements:
            self.waiting[p.request_id] = f"placement lost a race and is retried: {why}"[:500]

    def _commit(self) -> bool:
        units, self.units = self.units, []
        if not units and not self.reclaims:
            return True
        if not self.renew():
            log.warning("placement cycle stops: it lost the placement lease")
            return False
        if self.node_ids is None:  # the first decision: names → ids, once per cycle
            # The fleet the snapshot was made of (kept per fleet version), not 4,500 rows read
            # again: a node or GPU gone since is refused by `place_many`, which locks its row.
            self.fleet = fleet_cache.fleet()
            self.node_ids, self.gpu_ids = self.fleet.node_ids, self.fleet.gpu_ids
        report = self.report
        # A unit with victims evicts them first in its own savepoint; the plain ones commit
        # together through `place_many`, which refuses only what no longer fits.
        with transaction.atomic():
            fence(self.lease.token)
            plain: list[list[services.Placing]] = []
            placed: list[int] = []
            evicted: list[Eviction] = []
            for placements, victims in units:
                try:
                    placings = [_placing(p, self.node_ids, self.gpu_ids, self.remote.get(p.request_id), self.fleet)
                                for p in placements]
                except KeyError as exc:  # the node or GPU left the fleet (or its GPU was cordoned) since
                    self._lost_race(placements, f"{exc} is gone")
                    continue
                if not victims:
                    plain.append(placings)
                    continue
                mine: list[Eviction] = []
                before = len(report.preempted)
                try:
                    with transaction.atomic():
                        for victim in victims:
                            _evict(int(victim), self.rows[placements[0].request_id], placements[0].admission,
                                   report, mine)
                        _, refused = services.place_many([placings], actors.SCHEDULER)
                        if refused:
                            raise next(iter(refused.values()))
                except (services.CapacityConflict, IllegalTransition, Reservation.DoesNotExist) as exc:
                    del report.preempted[before:]  # rolled back with the savepoint
                    self._lost_race(placements, exc)
                    continue
                evicted.extend(mine)
                placed.extend(p.reservation_id for p in placings)
            if plain:
                ok, refused = services.place_many(plain, actors.SCHEDULER)
                placed.extend(r.pk for r in ok)
                report.conflicts += len({id(unit) for unit in plain if any(p.reservation_id in refused for p in unit)})
                for rid, exc in refused.items():
                    self.waiting[str(rid)] = f"placement lost a race and is retried: {exc}"[:500]
            self._warn(evicted)
            report.placed.extend(placed)
            done = set(placed)
            self.committed += [p for placements, _ in units for p in placements if int(p.request_id) in done]
            if placed or evicted:
                transaction.on_commit(lambda: self.on_bind(placed, evicted))
        return True
