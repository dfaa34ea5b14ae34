"""Delete pods on the cluster: one pod (idempotent: a missing pod is no error), and the pods of
reservations that stopped holding GPUs.

A pod that finished by itself (its reservation succeeded or failed) holds nothing once its share
is released, and its log is what its owner reads next: a kubectl pod is left to its owner (a Job's
`ttlSecondsAfterFinished`, `kubectl delete`), a portal pod is kept TESSERA_KEEP_FINISHED_PODS_S
(default an hour) for the reservation page's log, then deleted. Whatever ends a pod, its last
lines are kept first (reservations' PodLog), so the page still shows them once it is gone."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from portal.reservations import services
from portal.reservations.models import Reservation, Source
from portal.reservations.states import HOLDS_GPU, State
from scheduler.backends import Backend, BackendError, PodRef

log = logging.getLogger(__name__)
GRACE_S = 30
LOG_LINES = 200  # what the reservation page shows of a pod's log, live or kept
FINISHED = (State.SUCCEEDED, State.FAILED)


def keep_finished_s() -> int:
    return int(settings.TESSERA_KEEP_FINISHED_PODS_S)


def delete_pod(backend: Backend, namespace: str, name: str, reason: str, grace_s: int = GRACE_S) -> bool:
    """Delete one pod; False when there was none. Transient backend errors are raised."""
    if not namespace or not name:
        return False
    keep_log(backend, namespace, name)
    return backend.unbind(PodRef(namespace, name), grace_s, reason)


def keep_log(backend: Backend, namespace: str, name: str) -> None:
    """Keep the last lines of a reservation's pod before it is deleted. A log the cluster does not
    give now is not worth keeping the pod for: the deletion goes on without it."""
    if not Reservation.objects.filter(pod_namespace=namespace, pod_name=name).exists():
        return  # a pod no reservation names (a stray, a rejected kubectl pod): nobody reads its log
    try:
        text = backend.pod_log(PodRef(namespace, name), LOG_LINES)
    except BackendError as exc:
        log.warning("could not keep the log of pod %s/%s: %s", namespace, name, exc)
        return
    if text:
        services.keep_pod_log(namespace, name, text)


def delete_quietly(backend: Backend, namespace: str, name: str, reason: str, grace_s: int = GRACE_S) -> None:
    """`delete_pod` where a failure only waits for the next sweep (`release_ended_pods` or
    reconcile retries it): after a preemption, expiry, idle reclaim or node loss, or a reclaim
    warning (with the grace its team's policy gives)."""
    try:
        delete_pod(backend, namespace, name, reason, grace_s)
    except BackendError as exc:
        log.warning("could not delete pod %s/%s yet: %s", namespace, name, exc)


def ended_pods():
    """(id, state, pod namespace, pod name) of the reservations whose pod should go, in no order
    (each pass takes what it can). Only rows that name a pod are read (the `reservation_with_pod`
    partial index), not every reservation ever made."""
    kept_since = timezone.now() - timedelta(seconds=keep_finished_s())
    return (Reservation.objects.filter(pod_name__gt="").exclude(state__in=HOLDS_GPU)
            .exclude(source=Source.KUBECTL, state=State.PENDING)
            .exclude(source=Source.KUBECTL, state__in=FINISHED)
            .exclude(Q(state__in=FINISHED) & (Q(finished_at__gt=kept_since) | Q(finished_at__isnull=True)))
            .order_by().values_list("pk", "state", "pod_namespace", "pod_name"))


def release_ended_pods(backend: Backend, limit: int = 500) -> int:
    """Delete the pods of reservations that stopped holding GPUs (cancelled, preempted, expired,
    requeued; finished portal pods once kept long enough), then forget the pod name. A kubectl
    reservation still waiting keeps its pod: it is the request itself; a finished kubectl pod is its
    owner's. Returns how many pods were deleted."""
    deleted = 0
    for pk, state, namespace, name in ended_pods()[:limit]:
        try:
            if delete_pod(backend, namespace, name, f"reservation {pk} is {state}"):
                deleted += 1
        except BackendError as exc:  # tried again next time
            log.warning("could not delete pod %s/%s: %s", namespace, name, exc)
            continue
        services.forget_pod(pk, name)
    return deleted
