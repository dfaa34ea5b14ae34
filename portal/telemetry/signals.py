"""Channel-layer pushes to connected agents: placements when a node's allocations change, and a
close when its token changes (both after commit)."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from portal.fleet.models import Node
from portal.reservations.events import allocations_changed

log = logging.getLogger(__name__)


@receiver(allocations_changed, dispatch_uid="telemetry.push_placements")
def push_placements(sender, node_ids: list[int], **kwargs) -> None:
    layer = get_channel_layer()
    if layer is None or not node_ids:
        return

    async def send_all() -> None:
        # One trip into the event loop for the whole commit, the sends side by side: a placement
        # cycle's batch touches a hundred nodes, and one async_to_sync each cost ~3 ms.
        results = await asyncio.gather(
            *(layer.group_send(f"agent.node.{node_id}", {"type": "placements.changed"}) for node_id in node_ids),
            return_exceptions=True)
        for node_id, result in zip(node_ids, results, strict=True):
            if isinstance(result, Exception):
                # The agent gets the full list again at its next hello; a lost push must not fail
                # the placement that already committed.
                log.error("could not push placements to the agent of node %s: %r", node_id, result)

    try:
        async_to_sync(send_all)()
    except Exception:
        log.exception("could not push placements to the agents of nodes %s", node_ids)


@receiver(post_save, sender=Node, dispatch_uid="telemetry.token_changed")
def close_agent_on_new_token(sender, instance: Node, update_fields=None, **kwargs) -> None:
    """A node token revoked or re-issued: the connection made with the old one is closed (the
    agent then reconnects and is refused, or let in with the new token)."""
    if update_fields is None or "agent_token_hash" not in update_fields:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    node_id = instance.pk

    def send() -> None:
        try:
            async_to_sync(layer.group_send)(f"agent.node.{node_id}", {"type": "agent.token_changed"})
        except Exception:
            log.exception("could not close the agent connection of node %s", node_id)

    transaction.on_commit(send)
