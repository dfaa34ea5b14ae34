"""One placement cycle: snapshot the database, run the engine, commit each decision.

Decisions commit in batches while the engine is still deciding (`scheduler.core.decide` yields
them one by one): 25 first, then twice as many each time up to 200, so that binding starts early
and a large burst costs few round trips. Each batch's transaction (1) passes the fence with this
cycle's token and (2) goes through `reservations.services.place_many`, which locks the GPU rows and
re-checks their free capacity. So no GPU is over-committed whatever runs concurrently, and a stale
cycle cannot write. A gang's members commit together: all of them or none. Pods are created after the
commit, by `bind` tasks (idempotent), never inside the transaction.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.bulk import update_rows
from portal.fleet.models import Gpu, Node
from portal.reservations import services
from portal.reservations.events import announce_reservations, announcements_held
from portal.reservations.models import Allocation, Kind, Reservation, Source
from portal.reservations.states import HOLDS_GPU, IllegalTransition, State
from scheduler import core
from scheduler.backends import Backend, BackendError, pod_name

from . import memo, snapshot
from .backend import namespace
from .locking import Lease, fence

log = logging.getLogger(__name__)
ACTOR = "system:scheduler"
MILLI = Decimal("0.001")
# Decisions per commit: the first batch, and the most. Bind tasks are sent at each commit, so a
# small batch lets a second worker start on the pods sooner; a large one costs fewer round trips
# and fewer bind tasks.
FIRST_BATCH = 25
BATCH_DECISIONS = 200


class Queued(NamedTuple):
    pk: int
    priority: int
    created_at: datetime
    position: int | None
    estimated_start: datetime | None
    group: str


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

    def phase_text(self) -> str:
        return ", ".join(f"{name} {s:.3f}" for name, s in self.phases.items())


def _policy() -> str:
    return getattr(settings, "TESSERA_POLICY", "tessera")


def _reason_text(reasons: tuple[core.Reason, ...]) -> str:
    if not reasons:
        return "no GPU fits this request right now"
    return "; ".join(r.message for r in reasons)[:500]


def _shares(p: core.Placement, gpu_ids: dict[str, int]) -> list[services.Share]:
    share = Decimal(str(p.share)).quantize(MILLI)
    return [services.Share(gpu_id=gpu_ids[u], compute_share=share, memory_mib=p.memory_mib) for u in p.gpu_uuids]


def _after_place(r: Reservation) -> list[str]:
    """Inside the decision's transaction, on the locked row: count the attempt, name the pod, set
    the end. Returns the fields it set (`services.place_many` writes them with the rest)."""
    r.attempt += 1
    r.queue_position = r.estimated_start = r.idle_since = r.expiry_warned_at = None
    fields = ["attempt", "queue_position", "estimated_start", "idle_since", "expiry_warned_at"]
    if r.source == Source.PORTAL:
        r.pod_namespace, r.pod_name, r.pod_uid = namespace(), pod_name(r.pk, r.attempt), ""
        fields += ["pod_namespace", "pod_name", "pod_uid"]
    if r.kind == Kind.INTERACTIVE and r.max_duration_s is None and r.team.interactive_max_s:
        r.expires_at = timezone.now() + timedelta(seconds=r.team.interactive_max_s)
        fields.append("expires_at")
    return fields


def _decision(p: core.Placement, node_ids: dict[str, int], gpu_ids: dict[str, int]) -> services.Decision:
    return services.Decision(int(p.request_id), node_ids[p.node], tuple(_shares(p, gpu_ids)),
                             f"placed on {p.node} ({', '.join(p.gpu_uuids)})")


def _evict(victim_id: int, by: snapshot.Pending, report: CycleReport, backend: Backend | None) -> None:
    v = Reservation.objects.select_for_update().get(pk=victim_id)
    if v.state not in HOLDS_GPU:
        return
    why = f"preempted by reservation {by.pk} (priority {by.priority} over {v.priority})"
    services.transition(v.pk, State.PREEMPTED, ACTOR, why)
    # A kubectl pod is deleted by the preemption, so only portal reservations can come back.
    if v.requeue_on_preempt and v.source == Source.PORTAL:
        services.transition(v.pk, State.PENDING, ACTOR, f"requeued after being {why}")
    if backend is not None and v.pod_name:
        # After commit and before the preemptor's bind is sent (that callback is registered after
        # this one), so the two pods do not share the GPU; what fails here the next cycle retries.
        transaction.on_commit(lambda: _delete_quietly(backend, v.pod_namespace, v.pod_name, why))
    report.preempted.append(v.pk)


def _delete_quietly(backend: Backend, namespace: str, name: str, why: str) -> None:
    from .actions import unbind

    try:
        unbind(backend, namespace, name, why)
    except BackendError as exc:
        log.warning("could not delete the preempted pod %s/%s yet: %s", namespace, name, exc)


class _Batches:
    """A cycle's decisions, committed in batches: one fence check, a few set-based queries and one
    COMMIT for many. The first batch is small so that binding starts early; each next one is twice
    as large (fewer round trips and bind tasks), up to BATCH_DECISIONS."""

    def __init__(self, lease: Lease, renew: Callable[[], bool], on_bind: Callable[[list[int]], None],
                 rows: dict[str, snapshot.Pending], report: CycleReport, backend: Backend | None) -> None:
        self.lease, self.renew, self.on_bind, self.rows, self.report, self.backend = \
            lease, renew, on_bind, rows, report, backend
        self.units: list[tuple[list[core.Placement], tuple[str, ...]]] = []
        self.size = FIRST_BATCH
        self.waiting: dict[str, str] = {}
        self.node_ids: dict[str, int] | None = None
        self.gpu_ids: dict[str, int] = {}
        self.seconds = 0.0  # spent committing

    def commit(self) -> bool:
        started = time.perf_counter()
        try:
            return self._commit()
        finally:
            self.seconds += time.perf_counter() - started

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

    def _commit(self) -> bool:
        units, self.units = self.units, []
        if not units:
            return True
        if not self.renew():
            log.warning("placement cycle stops: it lost the placement lease")
            return False
        if self.node_ids is None:  # the first decision: names → ids, once per cycle
            self.node_ids = dict(Node.objects.values_list("name", "pk"))
            self.gpu_ids = dict(Gpu.objects.values_list("uuid", "pk"))
        report, waiting = self.report, self.waiting
        # A unit with victims evicts them first in its own savepoint; the plain ones commit
        # together through `place_many`, which refuses only what no longer fits.
        with transaction.atomic():
            fence(self.lease.token)
            plain: list[list[services.Decision]] = []
            placed: list[int] = []
            for placements, victims in units:
                try:
                    decisions = [_decision(p, self.node_ids, self.gpu_ids) for p in placements]
                except KeyError as exc:  # the node or GPU left the database since the snapshot
                    report.conflicts += 1
                    for p in placements:
                        waiting[p.request_id] = f"placement lost a race and is retried: {exc} is gone"[:500]
                    continue
                if not victims:
                    plain.append(decisions)
                    continue
                try:
                    with transaction.atomic():
                        for victim in victims:
                            _evict(int(victim), self.rows[placements[0].request_id], report, self.backend)
                        _, refused = services.place_many([decisions], ACTOR, _after_place)
                        if refused:
                            raise next(iter(refused.values()))
                except (services.CapacityConflict, IllegalTransition, Reservation.DoesNotExist) as exc:
                    report.conflicts += 1
                    for p in placements:
                        waiting[p.request_id] = f"placement lost a race and is retried: {exc}"[:500]
                    continue
                placed.extend(d.reservation_id for d in decisions)
            if plain:
                ok, refused = services.place_many(plain, ACTOR, _after_place)
                placed.extend(r.pk for r in ok)
                report.conflicts += len({id(unit) for unit in plain if any(d.reservation_id in refused for d in unit)})
                for rid, exc in refused.items():
                    waiting[str(rid)] = f"placement lost a race and is retried: {exc}"[:500]
            report.placed.extend(placed)
            if placed:  # registered last: runs after the victims' pods are deleted
                transaction.on_commit(lambda placed=placed: self.on_bind(placed))
        return True


def run_cycle(lease: Lease, on_bind: Callable[[list[int]], None], renew: Callable[[], bool] = lambda: True,
              backend: Backend | None = None) -> CycleReport:
    """Place what can be placed now. `on_bind(reservation_ids)` is called after each batch commits
    with the reservations it placed (the tasks module passes a function that sends a bind task)."""
    started = time.perf_counter()
    report = CycleReport()
    if backend is not None:
        from .actions import release_ended_pods
        from .kubectl import ingest

        release_ended_pods(backend)  # their GPUs are free in the database: free them on the cluster too
        ingest(backend)
    # The whole queue, briefly; full rows only for what this cycle looks at.
    queue = [Queued(*row) for row in Reservation.objects.filter(state=State.PENDING).order_by("created_at", "id")
             .values_list("pk", "priority", "created_at", "queue_position", "estimated_start", "group_name")]
    if not queue:
        report.seconds = time.perf_counter() - started
        return report
    epoch, skip, looked_at = memo.load()
    # A gang with a new (or newly evaluated) member is looked at whole again.
    fresh_groups = {q.group for q in queue if q.group and str(q.pk) not in skip}
    wanted = [q.pk for q in queue if str(q.pk) not in skip or q.group in fresh_groups]
    # Only what the engine's requests and the waiting reasons need (a cycle may read thousands).
    considered = snapshot.pending(wanted)
    rows = {str(r.pk): r for r in considered}
    report.looked_at = len(rows)
    requests = []
    for r in considered:
        try:
            requests.append(snapshot.to_request(r))
        except ValueError as exc:
            if not r.state_reason.startswith("cannot be placed as asked"):
                services.note_pending_reason(r.pk, f"cannot be placed as asked: {exc}")
    # No requests: everything waiting was looked at already and nothing has freed capacity since.
    # Decisions are committed while the engine goes on deciding, so the first pods can be bound
    # (by another worker) before the last decision is made.
    decisions = core.decide(snapshot.build(), requests, _policy()) if requests else iter(())
    batches = _Batches(lease, renew, on_bind, rows, report, backend)
    waiting = batches.waiting  # request id → why it waits
    unschedulable: set[str] = set()
    deciding = time.perf_counter()
    report.phases["read"] = deciding - started
    # Agents hear of this cycle's placements once per node, when its batches are done.
    with announcements_held():
        for decision in decisions:
            if isinstance(decision, core.Unschedulable):
                unschedulable.add(decision.request_id)
                waiting[decision.request_id] = _reason_text(decision.reasons)
            elif not batches.add(decision):
                break
        else:
            batches.commit()
        decided = time.perf_counter()
    announced = time.perf_counter()
    report.phases |= {"engine": decided - deciding - batches.seconds, "commit": batches.seconds,
                      "announce": announced - decided}

    for rid, why in waiting.items():
        if rows[rid].state_reason != why[:500]:  # most waiting reasons do not change between cycles
            services.note_pending_reason(int(rid), why)
    skipped = {str(q.pk) for q in queue} - set(rows)
    memo.save(epoch, unschedulable | skipped, looked_at if skip else time.time())
    report.unschedulable = len(unschedulable | skipped)
    update_queue(queue)
    report.seconds = time.perf_counter() - started
    report.phases["reasons and queue"] = time.perf_counter() - announced
    return report


def update_queue(queue: list[Queued]) -> None:
    """Queue position (priority, then age) and a rough estimated start for what still waits: the
    k-th waiting reservation may start when the k-th known end time among running ones comes."""
    still = set(Reservation.objects.filter(state=State.PENDING).values_list("pk", flat=True))
    order = sorted((q for q in queue if q.pk in still), key=lambda q: (-q.priority, q.created_at, q.pk))
    ends = sorted(Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__isnull=False)
                  .values_list("expires_at", flat=True))
    now = timezone.now()
    changed = []
    for position, q in enumerate(order, start=1):
        estimate = max(ends[position - 1], now) if position <= len(ends) else None
        if q.position != position or q.estimated_start != estimate:
            changed.append(Reservation(pk=q.pk, queue_position=position, estimated_start=estimate))
    update_rows(changed, ["queue_position", "estimated_start"])
    if changed:  # browsers watching them see the new place in the queue
        announce_reservations(dict(Reservation.objects.filter(pk__in=[r.pk for r in changed])
                                   .values_list("pk", "team_id")))
    # Left the queue another way (cancelled, failed): no position any more.
    Reservation.objects.filter(queue_position__isnull=False).exclude(state=State.PENDING).update(
        queue_position=None, estimated_start=None)


def live_shares_ok() -> list[str]:
    """Invariant check used by tests and reconcile: every GPU's live requests ≤ 1 and memory ≤ card."""
    problems = []
    totals: dict[int, list] = defaultdict(lambda: [Decimal(0), 0])
    for gpu_id, share, memory in Allocation.objects.filter(released_at__isnull=True).values_list(
            "gpu_id", "compute_share", "memory_mib"):
        totals[gpu_id][0] += share
        totals[gpu_id][1] += memory
    cards = dict(Gpu.objects.filter(pk__in=totals).values_list("pk", "memory_mib"))
    for gpu_id, (share, memory) in totals.items():
        if share > 1 or memory > cards[gpu_id]:
            problems.append(f"GPU {gpu_id}: share {share}, memory {memory}/{cards[gpu_id]} MiB")
    return problems


