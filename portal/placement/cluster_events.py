"""Apply what the cluster reports: pod phases and deletions, nodes going NotReady and coming back.

Every handler is idempotent: reservations move only by compare-and-set (`services.move`), since
events repeat, arrive late, or race with cancellations. The database row stays the one source of
truth: a pod phase only ever moves a reservation along its state machine.
"""

from __future__ import annotations

import logging

from django.db.models import Q

from portal.fleet import services as fleet
from portal.fleet.models import LostCause, Node, NodeStatus
from portal.reservations import actors, services
from portal.reservations.models import Reservation, Source
from portal.reservations.states import HOLDS_GPU, State
from scheduler.backends import Backend, ClusterEvent, NodeCondition, NodeEvent, Phase, PodEvent, PodStatus

from .pods import delete_pod, delete_quietly

log = logging.getLogger(__name__)


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
    if pod.deleting and not event.deleted:
        # Terminating: on its way out, whoever deleted it (with the reason they gave); the event of
        # its end follows. Deleting it again would only overwrite that reason.
        return
    if r is None or not is_current_pod(r, pod):
        # A pod of an older attempt, or of a reservation that no longer exists: ours to remove.
        if not event.deleted and not pod.external:
            delete_pod(backend, pod.namespace, pod.name, "no live reservation for this pod")
        return
    if event.deleted:
        if r.state in HOLDS_GPU or (r.state == State.PENDING and r.source == Source.KUBECTL):
            # We delete pods only after the reservation stopped holding its GPUs, so this came from outside.
            if r.reclaim_at is not None:  # we sent SIGTERM when we warned of the reclaim
                services.preempt(r.pk, "reclaimed: its pod ended after the reclaim warning", actors.LIFECYCLE)
            elif r.source == Source.KUBECTL:
                services.move(r.pk, (State.PENDING, *HOLDS_GPU), State.CANCELLED, "the pod was deleted (kubectl)",
                              actors.LIFECYCLE)
            else:
                services.release(r.pk, State.FAILED, f"pod {pod.name} was deleted outside Tessera", actors.LIFECYCLE)
        return
    if r.state not in HOLDS_GPU:
        # The reservation ended (cancelled, preempted, expired) and its pod still runs: remove it.
        # A pod that finished holds nothing: it stays for its logs (pods.release_ended_pods).
        if pod.phase not in (Phase.SUCCEEDED, Phase.FAILED):
            delete_pod(backend, pod.namespace, pod.name, f"reservation {r.pk} is {r.state}")
        return
    if not pod.external:
        services.record_pod(r.pk, pod, actors.LIFECYCLE)
    elif pod.phase == Phase.RUNNING:
        services.move(r.pk, State.PLACED, State.RUNNING, f"pod {pod.name} running on {pod.node}", actors.LIFECYCLE)
    if pod.phase == Phase.SUCCEEDED:
        services.release(r.pk, State.SUCCEEDED, f"pod {pod.name} completed", actors.LIFECYCLE)
    elif pod.phase == Phase.FAILED:
        if pod.reason == "NodeLost" and r.node_id is not None:
            lose_reservation(backend, r, f"node {pod.node} was lost")
        elif r.reclaim_at is not None:  # it stopped on the reclaim warning's SIGTERM
            services.preempt(r.pk, "reclaimed: its pod stopped after the reclaim warning", actors.LIFECYCLE)
        else:
            detail = ": ".join(x for x in (pod.reason, pod.message) if x) or "no reason given"
            services.release(r.pk, State.FAILED, f"pod {pod.name} failed ({detail})", actors.LIFECYCLE)


def lose_reservation(backend: Backend, r: Reservation, why: str) -> None:
    """The node under a reservation is gone: requeue or fail it (`services.lose`), and delete the
    pod of a portal one (a kubectl pod is the user's)."""
    services.lose(r.pk, why, actors.LIFECYCLE)
    if r.pod_name and r.source == Source.PORTAL:
        delete_quietly(backend, r.pod_namespace, r.pod_name, why)  # the node is gone; reconcile retries


def lose_node_reservations(backend: Backend, node: Node, why: str) -> int:
    """Lose what a lost node held: its GPUs' reservations, and the remote shares whose pods run
    there (their GPU elsewhere). Returns how many there were."""
    held = list(Reservation.objects.filter(Q(node=node) | Q(client_node=node), state__in=HOLDS_GPU))
    for r in held:
        lose_reservation(backend, r, why)
    return len(held)


def apply_node(backend: Backend, cond: NodeCondition) -> None:
    node = Node.objects.filter(name=cond.name).first()
    if node is None:
        return
    if cond.address and cond.address != node.address:  # where remote shares' pods reach its server
        fleet.record_addresses({cond.name: cond.address})
    if not cond.ready:
        reason = "the cluster reports the node not ready" + (f": {cond.reason}" if cond.reason else "")
        fleet.mark_lost(node.pk, LostCause.CLUSTER_NOT_READY, reason)
        lose_node_reservations(backend, node, f"node {node.name} is not ready")
    elif node.status == NodeStatus.LOST and node.lost_cause == LostCause.CLUSTER_NOT_READY:
        fleet.mark_back(node.pk, LostCause.CLUSTER_NOT_READY)  # requests a cycle that looks at every request
