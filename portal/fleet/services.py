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
