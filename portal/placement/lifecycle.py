"""What happens to a reservation after it is placed: cluster events, node loss, expiry, idleness.

Every handler is idempotent and checks the state it expects under a row lock (`actions._move`),
since events can repeat, arrive late, or race with cancellations. The database row stays the one
source of truth: a pod phase only ever moves a reservation along its state machine.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from portal.fleet.models import Node, NodeStatus
from portal.reservations.events import request_cycle
from portal.reservations.models import Reservation, Source
from portal.reservations.states import HOLDS_GPU, State
from scheduler.backends import Backend, ClusterEvent, NodeCondition, NodeEvent, Phase, PodEvent, PodStatus

from . import actions, memo
from .actions import _move

log = logging.getLogger(__name__)
ACTOR = "system:lifecycle"
CLUSTER_LOST_PREFIX = "the cluster reports the node not ready"
# Interactive reservations are warned this long before their end (or a tenth of their length).
WARN_BEFORE = timedelta(minutes=10)


def is_current_pod(r: Reservation, pod: PodStatus) -> bool:
    return (pod.namespace, pod.name) == (r.pod_namespace, r.pod_name)


def apply_events(backend: Backend, events: list[ClusterEvent]) -> int:
    for event in events:
        try:
            if isinstance(event, NodeEvent):
                apply_node(backend, event.node)
            else:
                apply_pod(backend, event)
        except Exception:  # one bad event must not stop the others
            log.exception("could not apply %s", event)
    return len(events)


def apply_pod(backend: Backend, event: PodEvent) -> None:
    pod = event.pod
    try:
        rid = int(pod.reservation_id or "")
    except ValueError:
        return
    r = Reservation.objects.filter(pk=rid).first()
    if r is None or not is_current_pod(r, pod):
        # A pod of an older attempt, or of a reservation that no longer exists: ours to remove.
        if not event.deleted and not pod.external:
            actions.unbind(backend, pod.namespace, pod.name, "no live reservation for this pod")
        return
    if event.deleted:
        if r.state in HOLDS_GPU or (r.state == State.PENDING and r.source == Source.KUBECTL):
            # We delete pods only after the reservation stopped holding its GPUs, so this came from outside.
            if r.source == Source.KUBECTL:
                for state in (State.PENDING, State.PLACED, State.RUNNING):
                    if _move(r.pk, state, State.CANCELLED, "the pod was deleted (kubectl)", ACTOR):
                        break
            else:
                actions._fail(r.pk, f"pod {pod.name} was deleted outside Tessera")
        return
    if r.state not in HOLDS_GPU:
        # The reservation ended (cancelled, preempted, expired) and its pod still runs: remove it.
        actions.unbind(backend, pod.namespace, pod.name, f"reservation {r.pk} is {r.state}")
        return
    if not pod.external:
        actions.record_pod(r.pk, pod)
    elif pod.phase == Phase.RUNNING:
        _move(r.pk, State.PLACED, State.RUNNING, f"pod {pod.name} running on {pod.node}", ACTOR)
    if pod.phase == Phase.SUCCEEDED:
        for state in (State.PLACED, State.RUNNING):
            if _move(r.pk, state, State.SUCCEEDED, f"pod {pod.name} completed", ACTOR):
                break
    elif pod.phase == Phase.FAILED:
        if pod.reason == "NodeLost" and r.node_id is not None:
            lose_reservation(backend, r, f"node {pod.node} was lost")
        else:
            detail = ": ".join(x for x in (pod.reason, pod.message) if x) or "no reason given"
            actions._fail(r.pk, f"pod {pod.name} failed ({detail})")


def lose_reservation(backend: Backend, r: Reservation, why: str) -> None:
    """The node under a reservation is gone: requeue it (team policy, portal reservations) or fail it."""
    pod = (r.pod_namespace, r.pod_name)
    requeue = r.team.requeue_on_node_lost and r.source == Source.PORTAL
    for state in (State.PLACED, State.RUNNING):
        if requeue and state == State.PLACED:
            moved = _move(r.pk, state, State.PENDING, f"requeued: {why}", ACTOR)
        elif requeue:
            # running → pending is not a legal step: the run ends, and the request goes back in.
            moved = _move(r.pk, state, State.PREEMPTED, why, ACTOR) and _move(
                r.pk, State.PREEMPTED, State.PENDING, f"requeued: {why}", ACTOR)
        else:
            moved = _move(r.pk, state, State.FAILED, why, ACTOR)
        if moved:
            break
    if pod[1] and r.source == Source.PORTAL:
        try:
            actions.unbind(backend, pod[0], pod[1], why)
        except Exception as exc:  # the node is gone; reconcile retries the delete later
            log.warning("could not delete pod %s/%s: %s", pod[0], pod[1], exc)


def apply_node(backend: Backend, cond: NodeCondition) -> None:
    node = Node.objects.filter(name=cond.name).first()
    if node is None:
        return
    if not cond.ready:
        with transaction.atomic():
            locked = Node.objects.select_for_update().get(pk=node.pk)
            if locked.status != NodeStatus.LOST:
                locked.status = NodeStatus.LOST
                locked.status_reason = f"{CLUSTER_LOST_PREFIX}: {cond.reason}"[:200] if cond.reason \
                    else CLUSTER_LOST_PREFIX
                locked.save(update_fields=["status", "status_reason"])
                request_cycle(f"node {node.name} not ready")
        for r in Reservation.objects.filter(node=node, state__in=HOLDS_GPU).select_related("team"):
            lose_reservation(backend, r, f"node {node.name} is not ready")
    elif node.status == NodeStatus.LOST and node.status_reason.startswith(CLUSTER_LOST_PREFIX):
        with transaction.atomic():
            updated = Node.objects.filter(pk=node.pk, status=NodeStatus.LOST,
                                          status_reason=node.status_reason).update(
                status=NodeStatus.READY, status_reason="")
            if updated:
                memo.bump_on_commit()
                request_cycle(f"node {node.name} ready again")


def expire_due(backend: Backend) -> tuple[int, int]:
    """End reservations whose time is up; warn those about to end. Returns (expired, warned)."""
    now = timezone.now()
    expired = 0
    for r in Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__lte=now):
        pod = (r.pod_namespace, r.pod_name)
        if any(_move(r.pk, s, State.EXPIRED, f"reached its end time {r.expires_at:%Y-%m-%d %H:%M} UTC", ACTOR)
               for s in (State.RUNNING, State.PLACED)):
            expired += 1
            actions.unbind(backend, pod[0], pod[1], "reservation expired")
    warned = 0
    for r in Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__gt=now, expiry_warned_at__isnull=True,
                                        placed_at__isnull=False):
        window = min(WARN_BEFORE, (r.expires_at - r.placed_at) / 10)
        if r.expires_at - now <= window:
            warned += Reservation.objects.filter(pk=r.pk, expiry_warned_at__isnull=True).update(expiry_warned_at=now)
    return expired, warned


def measured_utilization(reservation_ids: list[int], since) -> dict[int, float]:
    """Measured GPU use per reservation (fraction of one GPU, summed over its GPUs); absent = no data."""
    from portal.telemetry.services import recent_utilization

    return recent_utilization(reservation_ids, since)


def check_idle(backend: Backend, measure=measured_utilization) -> tuple[int, int]:
    """Flag reservations whose measured use stayed under their team's threshold for the team's
    time; end them when the team reclaims idle ones. Returns (flagged, reclaimed)."""
    now = timezone.now()
    flagged = reclaimed = 0
    running = list(Reservation.objects.filter(state=State.RUNNING, started_at__isnull=False).select_related("team"))
    by_window: dict[int, list[Reservation]] = {}
    for r in running:
        if r.team.idle_after_s and r.started_at <= now - timedelta(seconds=r.team.idle_after_s):
            by_window.setdefault(r.team.idle_after_s, []).append(r)
    for seconds, group in by_window.items():
        used = measure([r.pk for r in group], now - timedelta(seconds=seconds))
        for r in group:
            if r.pk not in used:
                continue  # no measurements is not idleness
            per_gpu = used[r.pk] / max(1, r.gpu_count)
            if per_gpu >= float(r.team.idle_threshold):
                if r.idle_since is not None:
                    Reservation.objects.filter(pk=r.pk).update(idle_since=None)
                continue
            if r.idle_since is None:
                flagged += Reservation.objects.filter(pk=r.pk, idle_since__isnull=True).update(idle_since=now)
            if r.team.idle_reclaim:
                why = (f"reclaimed: used {per_gpu:.1%} of its GPU over the last {seconds // 60} min, under "
                       f"team {r.team.slug}'s idle threshold of {float(r.team.idle_threshold):.1%}")
                if _move(r.pk, State.RUNNING, State.EXPIRED, why, ACTOR):
                    reclaimed += 1
                    actions.unbind(backend, r.pod_namespace, r.pod_name, "reclaimed while idle")
    return flagged, reclaimed
