"""The snapshot a cycle decided on, with what it committed: the forecast's starting point after a
cycle, without reading the cluster again.

The cycle's placements hold their GPUs (and their pods' CPU and memory on the node the pod runs
on), the reservations it preempted hold nothing, and the borrowed shares it warned go at their
reclaim time. Only what the caller says committed is applied (a placement that lost a race is
not); what changed meanwhile elsewhere (an end, a new node) shows in the next cycle's snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..model import Node, Placement, Request, Share, Snapshot
from ..state import share_of


def after_cycle(snapshot: Snapshot, placed: Iterable[tuple[Request, Placement]], gone: Iterable[str] = (),
                reclaim_at: Mapping[str, float] | None = None, pod_nodes: Mapping[str, str] | None = None
                ) -> Snapshot:
    """`snapshot` with `placed` (request and its committed placement) holding their GPUs, the
    reservations in `gone` holding none, and the shares in `reclaim_at` going at that time.
    `pod_nodes`: request id -> the node its pod runs on, where not the GPU's (a remote share).
    The CPU and memory of a preempted pod stay counted (the snapshot does not say how much)."""
    gone = set(gone)
    reclaim_at = reclaim_at or {}
    pod_nodes = pod_nodes or {}
    adds: dict[str, list[Share]] = {}  # GPU uuid -> new shares
    pods: dict[str, list[Request]] = {}  # node -> requests whose pod runs there
    for req, p in placed:
        share = replace(share_of(req, p.admission), gpu_request=p.gpu_request, gpu_memory_mib=p.gpu_memory_mib,
                        since=snapshot.now)
        for uuid in p.gpu_uuids:
            adds.setdefault(uuid, []).append(share)
        pods.setdefault(pod_nodes.get(req.id, p.node), []).append(req)
    if not (adds or gone or reclaim_at):
        return snapshot

    def shares_of(gpu) -> tuple[Share, ...]:
        kept = tuple(s if s.reservation_id not in reclaim_at else replace(s, reclaim_at=reclaim_at[s.reservation_id])
                     for s in gpu.shares if s.reservation_id not in gone)
        return kept + tuple(adds.get(gpu.uuid, ()))

    def node_after(node: Node) -> Node:
        touched = node.name in pods or any(
            gpu.uuid in adds or any(s.reservation_id in gone or s.reservation_id in reclaim_at for s in gpu.shares)
            for gpu in node.gpus)
        if not touched:
            return node  # the same object: the fleet's layout still knows it
        new = pods.get(node.name, ())
        cpu, memory = node.cpu_milli_free, node.memory_mib_free
        return replace(node, gpus=tuple(replace(gpu, shares=shares_of(gpu)) for gpu in node.gpus),
                       cpu_milli_free=None if cpu is None else max(0, cpu - sum(r.cpu_milli for r in new)),
                       memory_mib_free=None if memory is None else max(0, memory - sum(r.memory_mib for r in new)))

    return replace(snapshot, nodes=tuple(node_after(n) for n in snapshot.nodes))
