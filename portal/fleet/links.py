"""Measured links between nodes, as agents report them (wire `links`, agents/remote/probe.py).

One writer: `store_links` replaces a node's links with its agent's latest report, in one
transaction, so placement (portal.placement.snapshot.links) never sees half of a report. A report
is bounded by the wire protocol (MAX_LINKS); one naming an unknown node or the sender itself is
refused whole, with the field at fault.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import transaction

from portal.cycle_requests import request_cycle
from scheduler.backends.base import REMOTE_SERVER_PORT
from wire.agent_portal import MAX_LINKS, Links

from .models import Node, NodeLink, NodeStatus


def server_address(name: str, address: str | None) -> str:
    """Where pods and agents on other nodes reach node `name`'s remote-share server: the node's
    InternalIP as the cluster reports it (`Node.address`; the server listens on that port of the
    node, hostPort in deploy/agent/node-plugins.yaml). Node names are not resolvable in most
    clusters' DNS; only where the cluster reported no address (the local backend) the name stands in."""
    host = address or name
    return f"[{host}]:{REMOTE_SERVER_PORT}" if ":" in host else f"{host}:{REMOTE_SERVER_PORT}"


def remote_servers_for(node: Node) -> list[dict[str, str]]:
    """The GPU nodes' servers `node`'s agent should probe (wire `welcome.remote_servers`): every
    other node with a GPU that is not lost, at most MAX_LINKS, those already measured first (so a
    fleet above the bound keeps its links) and then by name."""
    measured = set(NodeLink.objects.filter(client=node).values_list("gpu_node_id", flat=True))
    rows = (Node.objects.filter(gpus__isnull=False).exclude(pk=node.pk).exclude(status=NodeStatus.LOST)
            .distinct().order_by("name").values_list("pk", "name", "address"))
    rows = sorted(rows, key=lambda row: row[0] not in measured)[:MAX_LINKS]
    return [{"node": name, "address": server_address(name, address)} for _, name, address in rows]


class LinksRefused(ValueError):
    """The report names a node the portal does not know, or the sender's own node."""


def store_links(node: Node, report: Links) -> int:
    """Replace `node`'s links with `report`'s; returns how many are stored."""
    names = [link.gpu_node for link in report.links]
    known = dict(Node.objects.filter(name__in=names).values_list("name", "pk"))
    for i, name in enumerate(names):
        if name == node.name:
            raise LinksRefused(f"links[{i}].gpu_node: {name} is this node; a link joins two nodes")
        if name not in known:
            raise LinksRefused(f"links[{i}].gpu_node: no node {name!r} in the portal's fleet")
    rows = [NodeLink(client_id=node.pk, gpu_node_id=known[link.gpu_node], rtt_ms=link.rtt_ms,
                     bandwidth_mbps=link.bandwidth_mbps, measured_at=datetime.fromtimestamp(link.ts_ms / 1000, UTC))
            for link in report.links]
    with transaction.atomic():
        before = {g: (rtt, mbps) for g, rtt, mbps in NodeLink.objects.select_for_update()
                  .filter(client_id=node.pk).values_list("gpu_node_id", "rtt_ms", "bandwidth_mbps")}
        NodeLink.objects.filter(client_id=node.pk).delete()
        NodeLink.objects.bulk_create(rows)
        if _may_place_more(before, {r.gpu_node_id: (r.rtt_ms, r.bandwidth_mbps) for r in rows}):
            request_cycle(f"links of node {node.name} improved", freed=True)
    return len(rows)


def _may_place_more(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]) -> bool:
    """A new link, or one much better than before, may let a waiting request go remote: placement
    must look again at what it skipped (portal.placement.memo). Small changes, most reports, do not."""
    for gpu_node, (rtt, mbps) in after.items():
        old = before.get(gpu_node)
        if old is None or rtt < 0.8 * old[0] or mbps > 1.25 * old[1]:
            return True
    return False
