"""Celery tasks of the placement app. All are short and idempotent (acks late: a task whose worker
died is run again, which is harmless); none uses an ETA.

The scheduling cycle does no cluster I/O; everything that talks to the cluster has its own task,
its own time limit and (where two at once would only race) single-flight:

- `placement.cycle`: single-flight placement cycle (see locking), rerun while requests arrive;
  reads the database, runs the engine, commits, and sends `bind_many` after each commit.
- `placement.bind_many`: delete the pods of what a commit preempted, then create the pods of what
  it placed; transient backend errors retry with backoff, then reconcile picks up what is left.
- `placement.housekeeping`: delete the pods of ended reservations; admit new kubectl pods.
- `placement.sync`: apply the cluster's events (pod phases, deletions, node readiness).
- `placement.lifecycle`: expiry, warnings and idle reclaim.
- `placement.bookings`: start and end planned drains; start the bookings whose window has come;
  release no-shows.
- `placement.reconcile`: compare database and cluster.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from scheduler.backends import TransientBackendError

from . import admission, binding, cluster_events, expiry, foreign_claims, idle, pods
from . import bookings as booking_checks
from . import reconcile as reconciling
from .backend import get_backend
from .commit import Eviction
from .cycle import run_cycle
from .locking import FencedOut, cluster_lock, single_flight

log = logging.getLogger(__name__)
MAX_ROUNDS = 20  # cycles one holder runs back to back before it lets the next task take over
LIMIT_S = settings.TESSERA_CLUSTER_TASK_LIMIT_S
CLUSTER_TASK = {"acks_late": True, "soft_time_limit": LIMIT_S, "time_limit": LIMIT_S + 15}
RETRY = {"autoretry_for": (TransientBackendError,), "retry_backoff": 1, "retry_backoff_max": 30,
         "retry_jitter": True, "max_retries": 8}
HOUSEKEEPING_QUEUED_KEY = "tessera:placement:housekeeping-queued"


def enqueue_binds(reservation_ids: list[int], evicted: list[Eviction]) -> None:
    bind_many.delay(reservation_ids, [list(e) for e in evicted])


def run_cycles(reason: str = "") -> int:
    """Run a cycle if someone asked for one. Returns how many ran (0: another holder runs).

    With Redis, a holder runs one cycle and, if more was asked meanwhile, queues the next one
    behind the bind tasks it just sent (so one worker alone still binds between cycles). In
    process (no Redis) it loops, at most MAX_ROUNDS times."""
    lock = cluster_lock()
    lock.mark_dirty()
    ran = 0
    while ran < MAX_ROUNDS:
        lease = lock.acquire()
        if lease is None:
            return ran
        try:
            if lock.take_dirty():
                ran += 1
                report = run_cycle(lease, enqueue_binds, renew=lambda lease=lease: lock.renew(lease))
                log.info("cycle (%s): placed %d, preempted %d, waiting %d, conflicts %d in %.3f s (looked at %d; %s)",
                         reason, len(report.placed), len(report.preempted), report.unschedulable, report.conflicts,
                         report.seconds, report.looked_at, report.phase_text())
        except FencedOut as exc:
            log.warning("placement cycle fenced out: %s", exc)
            lock.mark_dirty()
        finally:
            lock.release(lease)
        # A request that came while we held the lock must not be lost.
        if not lock.take_dirty():
            return ran
        lock.mark_dirty()
        if lock.one_cycle_per_task:
            break
    if lock.claim_queued():
        cycle.delay(reason="continued")
    return ran


def enqueue_cycle(reason: str) -> bool:
    """Send the cycle task, single-flight (the placement app calls it on `cycle_requested`, after
    a commit: portal/cycle_requests.py). Returns whether a task was sent (one already queued
    and not yet started will see this change, so none is needed)."""
    lock = cluster_lock()
    lock.mark_dirty()
    if not lock.claim_queued():
        return False
    cycle.delay(reason=reason)
    return True


def request_housekeeping() -> bool:
    """Ask for housekeeping soon (a reservation ended: its pod goes). One queued task serves any
    number of requests; beat sends one every few seconds anyway."""
    if not cluster_lock().claim(HOUSEKEEPING_QUEUED_KEY, 30):
        return False
    housekeeping.delay()
    return True


@shared_task(name="placement.cycle", acks_late=True)
def cycle(reason: str = "") -> int:
    cluster_lock().clear_queued()
    return run_cycles(reason)


@shared_task(name="placement.bind_many", bind=True, max_retries=8, **CLUSTER_TASK)
def bind_many(self, reservation_ids: list[int], evicted: list[list[str]] | None = None) -> int:
    """Bind what one batch of decisions placed, after deleting the pods of the reservations it
    preempted (so two pods never share the GPU); retry (with backoff) only those that met a
    transient error. Returns how many pods exist now."""
    backend = get_backend()
    for namespace, name, why, *grace in evicted or ():
        # A reclaim warning gives the pod its team's grace between SIGTERM and SIGKILL.
        pods.delete_quietly(backend, namespace, name, why, *grace)  # what fails here, housekeeping retries
    report = binding.bind_batch(backend, [int(rid) for rid in reservation_ids])
    binding.announce(report.nodes)
    if report.transient:
        raise self.retry(args=[sorted(report.transient)], countdown=min(30, 2 ** self.request.retries))
    return report.bound


@shared_task(name="placement.housekeeping", **CLUSTER_TASK)
def housekeeping() -> dict:
    """Free on the cluster what the database already freed (pods of ended reservations), turn new
    kubectl pods into reservations, and read what other schedulers' DRA claims hold of our GPUs
    (foreign_claims). Skipped while another runs."""
    cluster_lock().unclaim(HOUSEKEEPING_QUEUED_KEY)
    with single_flight("housekeeping", LIMIT_S + 15) as held:
        if not held:
            return {"skipped": True}
        backend = get_backend()
        deleted = pods.release_ended_pods(backend)
        admitted, rejected = admission.ingest(backend)
        foreign = foreign_claims.observe(backend)
    return {"deleted": deleted, "admitted": admitted, "rejected": rejected, "foreign_claims": foreign}


@shared_task(name="placement.sync", **CLUSTER_TASK, **RETRY)
def sync(timeout_s: float = 0.0) -> int:
    with single_flight("sync", LIMIT_S + 15) as held:
        if not held:
            return 0
        backend = get_backend()
        return cluster_events.apply_events(backend, backend.poll(timeout_s))


@shared_task(name="placement.lifecycle", **CLUSTER_TASK)
def lifecycle_checks() -> dict:
    backend = get_backend()
    expired, warned = expiry.expire_due(backend)
    try:
        flagged, reclaimed = idle.check_idle(backend)
    except ImportError:  # telemetry not installed: nothing measured, nothing idle
        flagged = reclaimed = 0
    return {"expired": expired, "warned": warned, "idle": flagged, "reclaimed": reclaimed}


@shared_task(name="placement.bookings", acks_late=True)
def bookings() -> dict:
    """Database only (no cluster I/O): a started booking's pod is made by the cycle and bind."""
    return booking_checks.tick()


@shared_task(name="placement.reconcile", **CLUSTER_TASK, **RETRY)
def reconcile() -> dict:
    with single_flight("reconcile", LIMIT_S + 15) as held:
        if not held:
            return {"skipped": True}
        report = reconciling.reconcile(get_backend())
    return {"deleted": report.deleted, "rebound": report.rebound, "failed": report.failed,
            "nodes_lost": report.nodes_lost}
