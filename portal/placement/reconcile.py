"""Compare the database with the cluster and make the cluster match (on start and periodically).

- a pod without a live reservation (or of an older attempt) is deleted;
- a placed reservation without its pod gets it (re)created: bind is idempotent, and a bind that a
  killed worker never finished is redone here; a running one whose pod vanished fails with a reason;
- a node the cluster reports NotReady is handled as lost (team policy: requeue or fail), and one
  that is Ready again returns;
- where the cluster does not watch its nodes (`backend.watches_nodes` false: the local backend),
  a node whose agent went silent (fleet.services.mark_lost_nodes) is handled as lost the same way:
  nothing else would ever end its reservations. On Kubernetes a silent agent alone ends nothing:
  the kubelet may still run the pods, and the cluster says when the node is really gone.

The pods are listed before the database is read, so a pod created meanwhile is never mistaken
for an orphan: its reservation was committed before its bind started.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from portal.fleet import services as fleet
from portal.fleet.models import LostCause, Node, NodeStatus
from portal.reservations import actors, services
from portal.reservations.models import Reservation, Source
from portal.reservations.states import HOLDS_GPU, State
from scheduler.backends import Backend, NodeEvent, Phase, PodEvent, PodStatus

from . import binding
from .cluster_events import apply_events, apply_pod, is_current_pod, lose_node_reservations
from .pods import GRACE_S

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    deleted: list[str] = field(default_factory=list)
    rebound: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    nodes_lost: list[str] = field(default_factory=list)


def reconcile(backend: Backend) -> ReconcileReport:
    report = ReconcileReport()
    pods = backend.list_pods()
    conditions = backend.list_nodes()
    live = {r.pk: r for r in Reservation.objects.filter(state__in=HOLDS_GPU).select_related("team", "node")}
    # Finished pods their reservation still names: kept for their logs (pods.release_ended_pods).
    finished = {(pod.namespace, pod.name) for pod in pods if pod.phase in (Phase.SUCCEEDED, Phase.FAILED)}
    kept = set(Reservation.objects.filter(state__in=(State.SUCCEEDED, State.FAILED),
                                          pod_name__in={name for _, name in finished})
               .values_list("pod_namespace", "pod_name")) & finished
    seen: set[int] = set()
    for pod in pods:
        try:
            rid = int(pod.reservation_id or "")
        except ValueError:
            rid = -1
        r = live.get(rid)
        if r is not None and is_current_pod(r, pod):
            seen.add(rid)
            apply_pod(backend, PodEvent(pod))  # catch up on a phase a lost event carried
            continue
        if pod.external and r is None and Reservation.objects.filter(pk=rid, state=State.PENDING).exists():
            continue  # bound kubectl pod of a reservation requeued meanwhile: handled by the cycle
        if pod.deleting or (pod.namespace, pod.name) in kept:
            continue  # terminating already, or finished and kept
        if pod.external and pod.reservation_id is None:
            continue  # a kubectl pod the webhook marked, not placed yet: the user's request itself
        if backend.unbind(pod.ref, GRACE_S, "no live reservation for this pod"):
            report.deleted.append(f"{pod.namespace}/{pod.name}")
    for rid, r in live.items():
        if rid in seen:
            continue
        if r.state == State.PLACED:
            binding.bind(backend, rid)
            report.rebound.append(rid)
        elif r.source == Source.KUBECTL:
            apply_pod(backend, PodEvent(_gone(r), deleted=True))
            report.failed.append(rid)
        else:
            services.release(rid, State.FAILED, f"its pod {r.pod_name} disappeared from the cluster", actors.RECONCILE)
            report.failed.append(rid)
    db_nodes = {n.name: n for n in Node.objects.all()}
    fleet.record_addresses({c.name: c.address for c in conditions
                            if c.address and c.name in db_nodes and db_nodes[c.name].address != c.address})
    for cond in conditions:
        node = db_nodes.get(cond.name)
        if node is None:
            continue
        if not cond.ready and node.status != NodeStatus.LOST:
            report.nodes_lost.append(cond.name)
        if not cond.ready or node.status == NodeStatus.LOST:
            apply_events(backend, [NodeEvent(cond)])
    if not backend.watches_nodes:
        for node in db_nodes.values():
            silent = node.status == NodeStatus.LOST and node.lost_cause == LostCause.AGENT_SILENT
            if silent and lose_node_reservations(backend, node, f"node {node.name} was lost: {node.status_reason}"):
                report.nodes_lost.append(node.name)
    return report


def _gone(r: Reservation) -> PodStatus:
    return PodStatus(namespace=r.pod_namespace, name=r.pod_name, uid=r.pod_uid, node=None, phase=Phase.UNKNOWN,
                     reservation_id=str(r.pk), external=True)
