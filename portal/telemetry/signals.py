"""Channel-layer pushes to connected agents: placements when a node's allocations change, the GPU
nodes' servers to probe when nodes change, and a close when its token is retired (all after commit)."""

from __future__ import annotations

import asyncio
import logging

from channels.layers import get_channel_layer
from django.dispatch import receiver

from portal.fleet.events import node_token_retired, nodes_changed
from portal.reservations.events import allocations_changed

from .background_sends import deliver

log = logging.getLogger(__name__)


@receiver(allocations_changed, dispatch_uid="telemetry.push_placements")
def push_placements(sender, node_ids: list[int], **kwargs) -> None:
    layer = get_channel_layer()
    if layer is None or not node_ids:
        return
    node_ids = list(node_ids)

    async def send_all() -> None:
        # The sends side by side: a placement cycle touches a hundred nodes.
        results = await asyncio.gather(
            *(layer.group_send(f"agent.node.{node_id}", {"type": "placements.changed"}) for node_id in node_ids),
            return_exceptions=True)
        for node_id, result in zip(node_ids, results, strict=True):
            if isinstance(result, Exception):
                # The agent gets the full list again at its next hello; a lost push must not fail
                # the placement that already committed.
                log.error("could not push placements to the agent of node %s: %r", node_id, result)

    deliver(send_all, f"placements to the agents of nodes {node_ids}")


# The connections of agents that probe GPU nodes' servers (their hello had `resources`).
REMOTE_PROBERS = "agent.remote"


@receiver(nodes_changed, dispatch_uid="telemetry.push_remote_servers")
def push_remote_servers(sender, node_ids: list[int], **kwargs) -> None:
    """A node lost or back, drained, moved (its address): the agents that probe GPU nodes' servers
    look again at which to probe; each sends its agent the list only if it changed."""
    layer = get_channel_layer()
    if layer is None:
        return

    async def send() -> None:
        await layer.group_send(REMOTE_PROBERS, {"type": "remote.servers.changed"})

    deliver(send, "the GPU nodes' servers to the probing agents")


def agent_token_group(token_hash: str) -> str:
    """The connections that authenticated with one node token (joined before the token is looked
    up, so a retirement committed after the lookup still reaches them)."""
    return f"agent.token.{token_hash}"


@receiver(node_token_retired, dispatch_uid="telemetry.token_retired")
def close_agents_of_retired_token(sender, node_id: int, token_hash: str, **kwargs) -> None:
    """A node token revoked or re-issued: every connection made with it is closed, hello or not
    (the agent then reconnects and is refused, or let in with the new token)."""
    layer = get_channel_layer()
    if layer is None:
        return

    async def send() -> None:
        await layer.group_send(agent_token_group(token_hash), {"type": "agent.token_changed"})

    deliver(send, f"the close of node {node_id}'s agent connections")
