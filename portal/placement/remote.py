"""Remote shares in the placement cycle (KubeGPU's adaptive sharing).

The engine places what it can where the pod runs: an exclusive GPU or a local share. What it
leaves waiting and may go remote (the request allows it, its team's policy permits it, one share
of less than a GPU, not in a pod group) is offered to `scheduler.core.remote.choose_sharing` on a
snapshot read after the cycle's own placements committed, with the links the agents measured: a
GPU with room for the share on one node, the pod on another node with room for it, joined by the
best measured link. Each remote placement commits through the same batches (fence, capacity
re-check in `reservations.services.place_many`) and is added to the snapshot before the next
request is looked at, so two of them never count the same room twice.
"""

from __future__ import annotations

from dataclasses import replace

from django.conf import settings

from scheduler import core
from scheduler.core.remote import RemotePolicy, SharingChoice, SharingMode, choose_sharing

from . import snapshot
from .commit import Batches


def policy() -> RemotePolicy:
    return RemotePolicy(allowed=True, min_bandwidth_mbps=settings.TESSERA_REMOTE_MIN_MBPS,
                        max_rtt_ms=settings.TESSERA_REMOTE_MAX_RTT_MS)


def candidates(requests: list[core.Request], rows: dict[str, snapshot.Pending], waiting: set[str]
               ) -> list[core.Request]:
    """Of the requests the engine left waiting, those that may use a remote share."""
    asked = [r for r in requests if r.id in waiting and rows[r.id].remote_allowed
             and r.gpu_count == 1 and r.gpu_request < 1 and r.group is None]
    if not asked:
        return []
    teams = snapshot.remote_teams()
    return [r for r in asked if r.team in teams]


def _with_share(snap: core.Snapshot, request: core.Request, choice: SharingChoice) -> core.Snapshot:
    """The snapshot with `choice` taken: the share on its GPU, the pod's CPU and memory on its node."""
    share = core.Share(reservation_id=request.id, gpu_request=request.gpu_request,
                       gpu_memory_mib=request.gpu_memory_mib,
                       priority=request.priority, team=request.team, affinity=request.affinity,
                       anti_affinity=request.anti_affinity, exclusion=request.exclusion)
    nodes = []
    for node in snap.nodes:
        if node.name == choice.gpu_node:
            node = replace(node, gpus=tuple(replace(g, shares=(*g.shares, share)) if g.uuid == choice.gpu_uuid else g
                                            for g in node.gpus))
        if node.name == choice.pod_node:
            node = replace(
                node,
                cpu_milli_free=None if node.cpu_milli_free is None else max(0, node.cpu_milli_free - request.cpu_milli),
                memory_mib_free=None if node.memory_mib_free is None
                else max(0, node.memory_mib_free - request.memory_mib))
        nodes.append(node)
    return replace(snap, nodes=tuple(nodes))


def place_remote(requests: list[core.Request], batches: Batches) -> set[str]:
    """Place what can go remote; returns the request ids placed remotely. The others' waiting
    reasons (`batches.waiting`) gain why they could not go remote either."""
    placed: set[str] = set()
    if not requests:
        return placed
    snap, link_table, rules = snapshot.build(), snapshot.links(), policy()
    for request in requests:
        choice = choose_sharing(snap, request, link_table, rules, settings.TESSERA_POLICY)
        if choice.mode != SharingMode.REMOTE:  # local ones are the engine's to make (fair share, gangs)
            why = batches.waiting.get(request.id, "")
            batches.waiting[request.id] = f"{why}; remote: {choice.reason}"[:500] if why else f"remote: {choice.reason}"
            continue
        batches.remote[request.id] = choice
        batches.waiting.pop(request.id, None)
        placement = core.Placement(request.id, choice.gpu_node, (choice.gpu_uuid,), (choice.gpu_index,),
                                   request.gpu_request, request.gpu_memory_mib, choice.score)
        placed.add(request.id)
        if not batches.add((placement,)):
            return placed
        snap = _with_share(snap, request, choice)
    batches.commit()
    return placed
