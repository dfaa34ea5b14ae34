"""What the cluster tells us about a reservation's pod: its uid (agents attribute GPU processes by
it), that it runs, and that it is gone for good."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from django.utils import timezone

from portal.bulk import update_values
from portal.reservations import actors
from portal.reservations.models import PodLog, Reservation
from portal.reservations.states import HOLDS_GPU, State
from scheduler.backends import Phase, PodStatus

from .moving import move


class PodHolder(Protocol):
    """What binding read of a placed reservation before it made the pod."""

    pk: int
    pod_name: str
    pod_uid: str
    node_id: int


def record_pods(pods: Sequence[tuple[PodHolder, PodStatus]], actor=actors.PLACEMENT) -> set[int]:
    """For each (reservation as binding read it, its pod): store the pod's uid where the
    reservation still names that pod (it may have been requeued meanwhile: a compare-and-set on
    pod_name), then move the ones whose pod already runs to running. Returns the nodes whose
    agents must hear of the new uids (their placements changed)."""
    changed = [(r, status) for r, status in pods if r.pod_name == status.name and r.pod_uid != status.uid]
    update_values(Reservation, ["pod_uid"], [(r.pk, status.uid, r.pod_name) for r, status in changed],
                  match=["pod_name"])
    for r, status in pods:
        if status.phase == Phase.RUNNING:
            move(r.pk, State.PLACED, State.RUNNING, f"pod {status.name} running on {status.node}", actor)
    return {r.node_id for r, _ in changed}


def record_pod(reservation_id: int, status: PodStatus, actor=actors.PLACEMENT) -> int | None:
    """`record_pods` of one pod seen by the cluster's events. Returns the node whose agent must
    hear of a new uid, else None."""
    changed = Reservation.objects.filter(pk=reservation_id, pod_name=status.name).exclude(
        pod_uid=status.uid).update(pod_uid=status.uid)
    node_id = Reservation.objects.values_list("node_id", flat=True).get(pk=reservation_id) if changed else None
    if status.phase == Phase.RUNNING:
        move(reservation_id, State.PLACED, State.RUNNING, f"pod {status.name} running on {status.node}", actor)
    return node_id


def forget_pod(reservation_id: int, pod_name: str) -> bool:
    """The pod of a reservation that no longer holds GPUs was deleted: stop naming it, unless
    the reservation was placed again meanwhile (then it names a new pod, or holds GPUs)."""
    return bool(Reservation.objects.filter(pk=reservation_id, pod_name=pod_name)
                .exclude(state__in=HOLDS_GPU).update(pod_name=""))


CLUSTER_WAIT = "the cluster has not taken the pod yet"


def note_cluster_waits(waiting: dict[int, str], created: Sequence[int] = ()) -> None:
    """Say why a placed reservation has no pod yet while its bind is retried (the API server refused
    it for a while: a fresh namespace's ServiceAccount, a full quota, 5xx, a timeout), and take the
    note back from those whose pod now exists. Only placed ones are touched."""
    for pk, why in waiting.items():
        Reservation.objects.filter(pk=pk, state=State.PLACED).update(
            state_reason=f"{CLUSTER_WAIT}: {why}; trying again"[:500], updated_at=timezone.now())
    if created:
        Reservation.objects.filter(pk__in=list(created), state=State.PLACED,
                                   state_reason__startswith=CLUSTER_WAIT).update(
            state_reason="pod created; waiting for it to start", updated_at=timezone.now())


def keep_pod_log(namespace: str, pod_name: str, text: str) -> int | None:
    """Keep the last lines of a pod about to be deleted for its reservation's page (one row per
    reservation: a later pod's log replaces an earlier attempt's). Returns the reservation's id,
    None when no reservation names that pod."""

    pk = (Reservation.objects.filter(pod_namespace=namespace, pod_name=pod_name)
          .values_list("pk", flat=True).first())
    if pk is not None:
        PodLog.objects.update_or_create(reservation_id=pk, defaults={
            "pod_name": pod_name, "text": text, "kept_at": timezone.now()})
    return pk
