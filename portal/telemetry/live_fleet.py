"""Live fleet changes for site admins: when a node's state changes (drained, returned, lost, back),
a GPU is cordoned or uncordoned, or shares are placed on or released from a node, the `fleet`
group (if anybody watches it) gets {"type": "nodes", "data": {"changed": [node ids], "ts_ms"}}.

Like reservations' messages it names what changed, not how it looks now: the fleet page fetches
the server-rendered rows of the changed nodes it has on screen and leaves the rest alone. One
message per commit (a placement cycle's batches announce their nodes once, at the end), so a
500-node fleet costs a page one small message, however many nodes it names.
"""

from __future__ import annotations

import json
import logging
import time

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.dispatch import receiver

from portal.fleet.events import nodes_changed
from portal.reservations.events import allocations_changed

from . import live
from .background_sends import sender as background
from .live.groups import FLEET

log = logging.getLogger(__name__)

GROUP = live.Group(FLEET, 0)


async def publish(node_ids: list[int]) -> bool:
    """Send the changed nodes to the `fleet` group; False when nobody watches it.

    The group's counter moves with every change, watched or not (one INCR per commit that touched
    nodes), and before the watchers are read: a page drawn at seq N that subscribes while a change
    goes out either gets the message or finds a later seq in its state and re-reads its rows."""
    seq = (await live.store().next_seqs([GROUP.name]))[GROUP.name]
    if GROUP.name not in await live.store().watched():
        return False
    text = json.dumps({"group": GROUP.name, "seq": seq, "type": "nodes",
                       "data": {"changed": sorted(node_ids), "ts_ms": int(time.time() * 1000)}},
                      separators=(",", ":"))
    await get_channel_layer().group_send(GROUP.channel_group, {"type": "live.message", "group": GROUP.name,
                                                                "text": text})
    return True


def _send(node_ids: list[int]) -> None:
    layer = get_channel_layer()
    if layer is None or not node_ids:
        return
    node_ids = list(node_ids)
    if isinstance(layer, InMemoryChannelLayer):
        # The quickstart: its queues belong to the server's loop, reached from a request thread.
        try:
            async_to_sync(publish)(node_ids)
        except Exception:
            log.exception("could not publish changes of nodes %s", node_ids[:10])
        return
    # Redis: on the process's sender loop, without waiting (a placement or a drain goes on).
    background.submit(lambda: publish(node_ids), f"changes of nodes {node_ids[:10]}")


@receiver(nodes_changed, dispatch_uid="telemetry.publish_node_changes")
def publish_node_changes(sender, node_ids: list[int], **kwargs) -> None:
    _send(node_ids)


@receiver(allocations_changed, dispatch_uid="telemetry.publish_allocation_changes_to_fleet")
def publish_allocation_changes(sender, node_ids: list[int], **kwargs) -> None:
    _send(node_ids)
