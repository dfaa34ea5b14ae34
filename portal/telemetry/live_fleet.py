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
from django.db import connections, router
from django.dispatch import receiver

from portal.fleet.events import nodes_changed
from portal.fleet.models import Gpu
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


def nodes_holding(reservation_ids: list[int]) -> list[int]:
    """The nodes whose GPUs these reservations hold now (live allocations), sorted. One statement
    written from the models' metadata: every submit and cancel asks (mostly for reservations
    that hold nothing), and the ORM compiled the join for ~1 ms of CPU each time."""
    if not reservation_ids:
        return []
    connection = connections[router.db_for_read(Allocation)]
    qn = connection.ops.quote_name
    alloc, gpu = Allocation._meta, Gpu._meta
    sql = (f"SELECT DISTINCT g.{qn(gpu.get_field('node').column)} FROM {qn(alloc.db_table)} a"  # noqa: S608 (metadata)
           f" JOIN {qn(gpu.db_table)} g ON g.{qn(gpu.pk.column)} = a.{qn(alloc.get_field('gpu').column)}"
           f" WHERE a.{qn(alloc.get_field('released_at').column)} IS NULL"
           f" AND a.{qn(alloc.get_field('reservation').column)} IN ({', '.join(['%s'] * len(reservation_ids))})")
    with connection.cursor() as cursor:
        cursor.execute(sql, reservation_ids)
        return sorted(row[0] for row in cursor.fetchall())


@receiver(reservations_changed, dispatch_uid="telemetry.publish_share_changes_to_fleet")
def publish_share_changes(sender, changes: dict[int, int], **kwargs) -> None:
    """A share's reservation changed (placed → running, idle, ending): the nodes it holds GPUs on
    show it, so their rows are read again. Only reservations holding GPUs name a node."""
    _send(nodes_holding(sorted(changes)))
