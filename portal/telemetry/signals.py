"""Push a node's placements to its agent when its allocations change (sent after commit)."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.dispatch import receiver

from portal.reservations.events import allocations_changed

log = logging.getLogger(__name__)


@receiver(allocations_changed, dispatch_uid="telemetry.push_placements")
def push_placements(sender, node_id: int, **kwargs) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(f"agent.node.{node_id}", {"type": "placements.changed"})
    except Exception:
        # The agent gets the full list again at its next hello; a lost push must not fail the
        # placement that already committed.
        log.exception("could not push placements to the agent of node %s", node_id)
