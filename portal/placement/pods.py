"""Delete pods on the cluster: one pod (idempotent: a missing pod is no error), and the pods of
reservations that stopped holding GPUs."""

from __future__ import annotations

import logging

from portal.reservations import services
from portal.reservations.models import Reservation, Source
from portal.reservations.states import HOLDS_GPU, State
from scheduler.backends import Backend, BackendError, PodRef

log = logging.getLogger(__name__)
GRACE_S = 30


def delete_pod(backend: Backend, namespace: str, name: str, reason: str, grace_s: int = GRACE_S) -> bool:
    """Delete one pod; False when there was none. Transient backend errors are raised."""
    if not namespace or not name:
        return False
    return backend.unbind(PodRef(namespace, name), grace_s, reason)


def delete_quietly(backend: Backend, namespace: str, name: str, reason: str) -> None:
    """`delete_pod` where a failure only waits for the next sweep (`release_ended_pods` or
    reconcile retries it): after a preemption, expiry, idle reclaim or node loss."""
    try:
        delete_pod(backend, namespace, name, reason)
    except BackendError as exc:
        log.warning("could not delete pod %s/%s yet: %s", namespace, name, exc)


def release_ended_pods(backend: Backend, limit: int = 500) -> int:
    """Delete the pods of reservations that stopped holding GPUs (cancelled, preempted, expired,
    failed, requeued), then forget the pod name. A kubectl reservation still waiting keeps its
    pod: it is the request itself. Returns how many pods were deleted."""
    ended = (Reservation.objects.filter(pod_name__gt="").exclude(state__in=HOLDS_GPU)
             .exclude(source=Source.KUBECTL, state=State.PENDING)
             .values_list("pk", "state", "pod_namespace", "pod_name")[:limit])
    deleted = 0
    for pk, state, namespace, name in ended:
        try:
            if delete_pod(backend, namespace, name, f"reservation {pk} is {state}"):
                deleted += 1
        except BackendError as exc:  # tried again next time
            log.warning("could not delete pod %s/%s: %s", namespace, name, exc)
            continue
        services.forget_pod(pk, name)
    return deleted
