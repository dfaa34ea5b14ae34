"""Fleet operations: drain and return nodes, node agent credentials, loading an inventory."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.utils import timezone

from portal.reservations.events import request_cycle
from portal.tenancy.models import hash_secret

from .models import Gpu, Node, NodeStatus


def _set_status(node_id: int, status: str, reason: str) -> Node:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.status != status or node.status_reason != reason:
            node.status = status
            node.status_reason = reason[:200]
            node.save(update_fields=["status", "status_reason"])
            request_cycle(f"node {node.name} {status}")
    return node


def drain(node_id: int, actor, reason: str = "") -> Node:
    """No new placements on the node; what runs there keeps running."""
    return _set_status(node_id, NodeStatus.DRAINING, reason or f"drained by {actor}")


def undrain(node_id: int, actor, reason: str = "") -> Node:
    return _set_status(node_id, NodeStatus.READY, reason)


def issue_node_token(node: Node) -> str:
    """A new agent credential for the node (the old one stops working). Shown once; stored hashed."""
    key = "tnode_" + secrets.token_urlsafe(32)
    node.agent_token_hash = hash_secret(key)
    node.agent_token_created_at = timezone.now()
    node.save(update_fields=["agent_token_hash", "agent_token_created_at"])
    return key


def revoke_node_token(node: Node) -> None:
    node.agent_token_hash = ""
    node.save(update_fields=["agent_token_hash"])


def node_for_token(key: str) -> Node | None:
    if not key:
        return None
    return Node.objects.filter(agent_token_hash=hash_secret(key)).exclude(agent_token_hash="").first()


@transaction.atomic
def apply_inventory(nodes: list[dict]) -> tuple[int, int]:
    """Create or update nodes and GPUs from a validated inventory (see portal.fleet.inventory).
    Returns (nodes, gpus) written."""
    gpu_total = 0
    for spec in nodes:
        node, _ = Node.objects.update_or_create(
            name=spec["name"],
            defaults={"labels": spec["labels"], "cpu_milli": spec["cpu_milli"], "memory_mib": spec["memory_mib"]},
        )
        for gpu in spec["gpus"]:
            Gpu.objects.update_or_create(
                uuid=gpu["uuid"],
                defaults={"node": node, "index": gpu["index"], "model": gpu["model"],
                          "memory_mib": gpu["memory_mib"], "nvlink_peers": gpu["nvlink_peers"],
                          "numa_node": gpu["numa_node"]},
            )
            gpu_total += 1
    request_cycle("inventory changed")
    return len(nodes), gpu_total


# Node agents report in (portal.telemetry): last_seen, lost and back, GPUs that came and went.

LOST_REASON_PREFIX = "no agent report for"


def record_seen(node_ids: list[int], at) -> None:
    Node.objects.filter(pk__in=node_ids).update(last_seen=at)


def mark_lost_nodes(silent_for) -> list[str]:
    """Mark lost every ready or draining node whose agent has been silent for `silent_for`
    (a timedelta), while other agents are heard. Nodes that never reported are left alone: with
    no agent deployed there is nothing to miss. Returns the names marked lost; each change
    requests a placement cycle."""
    cutoff = timezone.now() - silent_for
    names = []
    if not Node.objects.filter(last_seen__gte=cutoff).exists():
        # Not one agent heard: the portal's own ingestion was down (a restart, a long outage),
        # not every node at once. Marking them all lost would make orchestration act on nothing.
        return names
    silent = Node.objects.filter(last_seen__lt=cutoff).exclude(status=NodeStatus.LOST).values_list("pk", "name")
    for pk, name in silent:
        reason = f"{LOST_REASON_PREFIX} {int(silent_for.total_seconds())} s"
        with transaction.atomic():
            # Re-checked under the row lock: the agent may have come back meanwhile.
            node = Node.objects.select_for_update().get(pk=pk)
            if node.status == NodeStatus.LOST or node.last_seen is None or node.last_seen >= cutoff:
                continue
            node.status, node.status_reason = NodeStatus.LOST, reason
            node.save(update_fields=["status", "status_reason"])
            request_cycle(f"node {name} lost")
        names.append(name)
    return names


def mark_back(node_id: int) -> bool:
    """An agent reported again: a node that was lost for silence is ready again (a node that
    staff drained stays drained). Returns True when the status changed."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.status != NodeStatus.LOST or not node.status_reason.startswith(LOST_REASON_PREFIX):
            return False
        node.status, node.status_reason = NodeStatus.READY, ""
        node.save(update_fields=["status", "status_reason"])
        request_cycle(f"node {node.name} back")
    return True


def gpus_changed(node: Node) -> None:
    """The agent's GPU list differs from ours (a GPU gone or new): placements must look again."""
    request_cycle(f"GPUs of node {node.name} changed")
