"""One placement cycle: read the queue and a snapshot from the database, run the engine, commit.

It reads only the database and runs only the engine: no call to the cluster, so a slow or dead
API server delays binds and housekeeping (their own tasks, see `tasks`) but never the decisions.
Decisions commit in batches (`commit.Batches`) while the engine is still deciding
(`scheduler.core.decide` yields them one by one), so binding starts early.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.utils import timezone

from portal.reservations import services
from portal.reservations.events import announcements_held
from scheduler import core
from scheduler.core.forecast import after_cycle

from . import bookings_feed, memo, remote, snapshot
from .commit import Batches, CycleReport, OnBind
from .locking import Lease
from .queue import read_queue, update_queue
from .reasons import AwaitingApproval, waiting_text

__all__ = ["CycleReport", "run_cycle"]


def _reason_text(reasons: tuple[core.Reason, ...], request: core.Request | None,
                 awaiting: AwaitingApproval) -> str:
    if not reasons:
        return "no GPU fits this request right now"
    if request is None:  # a gang's own words: not one request's
        return "; ".join(r.message for r in reasons)[:500]
    return waiting_text(reasons, request, awaiting.count(request))


def _after(fleet: core.Snapshot, requests: list[core.Request], batches: Batches,
           reclaim_due: dict[str, float]) -> core.Snapshot:
    """The cycle's snapshot with what it committed: the queue's estimates start from it (no
    second read of the cluster per cycle)."""
    by_id = {r.id: r for r in requests}
    warned = {str(pk) for pk in batches.report.reclaiming}
    return after_cycle(fleet, [(by_id[p.request_id], p) for p in batches.committed if p.request_id in by_id],
                       gone=[str(pk) for pk in batches.report.preempted],
                       reclaim_at={rid: at for rid, at in reclaim_due.items() if rid in warned},
                       pod_nodes={rid: choice.pod_node for rid, choice in batches.remote.items()})


def run_cycle(lease: Lease, on_bind: OnBind, renew=lambda: True) -> CycleReport:
    """Place what can be placed now. `on_bind(reservation_ids, evicted_pods)` is called after
    each batch commits (the tasks module passes a function that sends a bind task)."""
    started = time.perf_counter()
    report = CycleReport()
    # The whole queue, briefly; full rows only for what this cycle looks at.
    queue = read_queue()
    booked = bookings_feed.bookings(timezone.now())
    holding = bookings_feed.held_soon(booked, timezone.now())  # a booked window's room to hold, its warnings
    if not queue and not holding:
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
    fleet = snapshot.build(booked) if requests or holding else None
    decisions = (core.decide(fleet, requests, settings.TESSERA_POLICY,
                             evictions=snapshot.past_evictions(timezone.now()))
                 if fleet is not None else iter(()))
    batches = Batches(lease, renew, on_bind, rows, report)
    waiting = batches.waiting  # request id → why it waits
    reclaim_due: dict[str, float] = {}  # reclaimed share → when it goes
    unschedulable: set[str] = set()
    by_id = {r.id: r for r in requests}
    awaiting = AwaitingApproval()  # read only when something waits
    deciding = time.perf_counter()
    report.phases["read"] = deciding - started
    # Agents hear of this cycle's placements once per node, when its batches are done.
    with announcements_held():
        for decision in decisions:
            if isinstance(decision, core.Unschedulable):
                unschedulable.add(decision.request_id)
                waiting[decision.request_id] = _reason_text(decision.reasons, by_id.get(decision.request_id),
                                                            awaiting)
            elif isinstance(decision, core.Reclaim):
                batches.reclaim(decision)  # not memoised: it is looked at again until its victims go
                reclaim_due.update(decision.due)
            elif not batches.add(decision):
                break
        else:
            batches.commit()
            # What the engine left waiting may use a share of a GPU on another node.
            unschedulable -= remote.place_remote(remote.candidates(requests, rows, unschedulable), batches)
        decided = time.perf_counter()
    announced = time.perf_counter()
    report.phases |= {"engine": decided - deciding - batches.seconds, "commit": batches.seconds,
                      "announce": announced - decided}

    for rid, why in waiting.items():
        if services.base_reason(rows[rid].state_reason) != why[:500]:  # most do not change between cycles
            services.note_pending_reason(int(rid), why)
    skipped = {str(q.pk) for q in queue} - set(rows)
    memo.save(epoch, unschedulable | skipped, looked_at if skip else time.time())
    report.unschedulable = len(unschedulable | skipped)
    update_queue(queue, None if fleet is None else _after(fleet, requests, batches, reclaim_due))
    report.seconds = time.perf_counter() - started
    report.phases["reasons and queue"] = time.perf_counter() - announced
    return report
