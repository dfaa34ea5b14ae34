"""Celery tasks of the placement app. All are short and idempotent (acks late: a task whose worker
died is run again, which is harmless); none uses an ETA.

- `placement.cycle`: single-flight placement cycle (see locking), rerun while requests arrive.
- `placement.bind` / `placement.unbind`: act on the cluster; transient backend errors retry with
  backoff, then reconcile picks up what is left.
- `placement.sync`: apply the cluster's events (pod phases, deletions, node readiness).
- `placement.lifecycle`: expiry, warnings and idle reclaim.
- `placement.reconcile`: compare database and cluster.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

from portal.reservations.events import announce_allocations
from scheduler.backends import TransientBackendError

from . import actions, lifecycle
from . import reconcile as reconciling
from .backend import get_backend
from .cycle import run_cycle
from .locking import FencedOut, ProcessLock, cluster_lock

log = logging.getLogger(__name__)
RETRY = {"autoretry_for": (TransientBackendError,), "retry_backoff": 1, "retry_backoff_max": 30,
         "retry_jitter": True, "max_retries": 8}
MAX_ROUNDS = 20  # cycles one holder runs back to back before it lets the next task take over


def enqueue_binds(reservation_ids: list[int]) -> None:
    bind_many.delay(reservation_ids)


def run_cycles(reason: str = "") -> int:
    """Run a cycle if someone asked for one. Returns how many ran (0: another holder runs).

    With Redis, a holder runs one cycle and, if more was asked meanwhile, queues the next one
    behind the bind tasks it just sent (so one worker alone still binds between cycles). In
    process (no Redis) it loops, at most MAX_ROUNDS times."""
    lock = cluster_lock()
    in_process = isinstance(lock, ProcessLock)
    lock.mark_dirty()
    ran = 0
    while ran < MAX_ROUNDS:
        lease = lock.acquire()
        if lease is None:
            return ran
        try:
            if lock.take_dirty():
                ran += 1
                report = run_cycle(lease, enqueue_binds, renew=lambda lease=lease: lock.renew(lease),
                                   backend=get_backend())
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
        if not in_process:
            break
    if lock.claim_queued():
        cycle.delay(reason="continued")
    return ran


def request_cycle(reason: str) -> bool:
    """Ask for a cycle (after a commit). Returns whether a task was sent (one already queued
    and not yet started will see this change, so none is needed)."""
    lock = cluster_lock()
    lock.mark_dirty()
    if not lock.claim_queued():
        return False
    cycle.delay(reason=reason)
    return True


@shared_task(name="placement.cycle", acks_late=True)
def cycle(reason: str = "") -> int:
    cluster_lock().clear_queued()
    return run_cycles(reason)


@shared_task(name="placement.bind", acks_late=True, **RETRY)
def bind(reservation_id: int) -> str | None:
    status = actions.bind(get_backend(), int(reservation_id))
    return status.name if status else None


@shared_task(name="placement.bind_many", bind=True, acks_late=True, max_retries=8)
def bind_many(self, reservation_ids: list[int]) -> int:
    """Bind what one batch of decisions placed; retry (with backoff) only those that met a
    transient error. Returns how many pods exist now."""
    report = actions.bind_batch(get_backend(), [int(rid) for rid in reservation_ids])
    with transaction.atomic():  # each agent hears once about the pods of this batch
        for node_id in sorted(report.nodes):
            announce_allocations(node_id)
    if report.transient:
        raise self.retry(args=[sorted(report.transient)], countdown=min(30, 2 ** self.request.retries))
    return report.bound


@shared_task(name="placement.unbind", acks_late=True, **RETRY)
def unbind(namespace: str, name: str, reason: str) -> bool:
    return actions.unbind(get_backend(), namespace, name, reason)


@shared_task(name="placement.sync", acks_late=True, **RETRY)
def sync(timeout_s: float = 0.0) -> int:
    backend = get_backend()
    return lifecycle.apply_events(backend, backend.poll(timeout_s))


@shared_task(name="placement.lifecycle", acks_late=True)
def lifecycle_checks() -> dict:
    backend = get_backend()
    expired, warned = lifecycle.expire_due(backend)
    try:
        flagged, reclaimed = lifecycle.check_idle(backend)
    except ImportError:  # telemetry not installed: nothing measured, nothing idle
        flagged = reclaimed = 0
    return {"expired": expired, "warned": warned, "idle": flagged, "reclaimed": reclaimed}


@shared_task(name="placement.reconcile", acks_late=True, **RETRY)
def reconcile() -> dict:
    report = reconciling.reconcile(get_backend())
    return {"deleted": report.deleted, "rebound": report.rebound, "failed": report.failed,
            "nodes_lost": report.nodes_lost}
