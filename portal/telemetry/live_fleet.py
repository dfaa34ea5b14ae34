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
import time

from channels.layers import get_channel_layer
from django.dispatch import receiver

from portal.fleet.events import nodes_changed
from portal.precompiled import Precompiled, param_in
from portal.reservations.events import allocations_changed, reservations_changed
from portal.reservations.models import Allocation

from . import live
from .background_sends import deliver
from .live.groups import FLEET

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
    if node_ids:
        node_ids = list(node_ids)
        deliver(lambda: publish(node_ids), f"changes of nodes {node_ids[:10]}")


@receiver(nodes_changed, dispatch_uid="telemetry.publish_node_changes")
def publish_node_changes(sender, node_ids: list[int], **kwargs) -> None:
    _send(node_ids)


@receiver(allocations_changed, dispatch_uid="telemetry.publish_allocation_changes_to_fleet")
def publish_allocation_changes(sender, node_ids: list[int], **kwargs) -> None:
    _send(node_ids)


# Every submit and cancel asks (mostly for reservations that hold nothing): compiled once
# (portal.precompiled), because the ORM compiled the join for ~1 ms of CPU each time.
_NODES_HOLDING = Precompiled(lambda: Allocation.objects.filter(param_in("reservation_id", "ids"),
                                                               released_at__isnull=True)
                             .order_by("gpu__node_id").values_list("gpu__node_id", flat=True).distinct())


def nodes_holding(reservation_ids: list[int]) -> list[int]:
    """The nodes whose GPUs these reservations hold now (live allocations), sorted."""
    return _NODES_HOLDING.all(ids=reservation_ids)


@receiver(reservations_changed, dispatch_uid="telemetry.publish_share_changes_to_fleet")
def publish_share_changes(sender, changes: dict[int, int], **kwargs) -> None:
    """A share's reservation changed (placed → running, idle, ending): the nodes it holds GPUs on
    show it, so their rows are read again. Only reservations holding GPUs name a node."""
    _send(nodes_holding(sorted(changes)))
