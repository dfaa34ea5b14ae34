"""An agent's hello: its stream (what it already sent), its GPUs reconciled with the node's
inventory, the node's CPU and memory, the node seen (and back from lost). What the connection
learns here (StreamInfo) goes with every batch it sends."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from portal.fleet import links
from portal.fleet import services as fleet_services
from portal.fleet.models import Node, NodeStatus
from wire.agent_portal import Hello

from . import seen
from .models import AgentStream


@dataclass(frozen=True)
class StreamInfo:
    """What a connection learnt at hello and needs for every batch."""

    stream_pk: int
    node_id: int
    node_name: str
    acked_seq: int
    gpu_ids: dict[str, int]  # GPU UUID → Gpu pk, for the GPUs of this node
    # The GPU nodes' servers its agent should probe (welcome.remote_servers); None: not for this agent.
    remote_servers: list[dict[str, str]] | None = None


def register_hello(node: Node, hello: Hello) -> StreamInfo:
    """Record the agent's stream and GPUs, mark the node seen (and back from lost)."""
    now = timezone.now()
    stream_id = uuid.UUID(hello.stream)
    with transaction.atomic():
        stream = AgentStream.objects.filter(node=node, stream=stream_id).first()
        if stream is None:
            stream, _ = AgentStream.objects.get_or_create(
                node=node, stream=stream_id,
                defaults={"agent_version": hello.agent_version, "source": hello.source,
                          "interval_ms": hello.interval_ms},
            )
        gpu_ids = fleet_services.reconcile_gpus(node, hello.gpus)
        status = Node.objects.filter(pk=node.pk).values_list("status", flat=True).first()
        fleet_services.record_seen([node.pk], now)
    if status == NodeStatus.LOST:
        fleet_services.mark_back(node.pk)
    if hello.resources is not None:  # bounded by the protocol; a node says only its own
        fleet_services.record_resources(node.pk, hello.resources.cpu_milli, hello.resources.memory_mib)
    seen.written(node.pk)
    # Agents that report the node's resources measure links too (and know the welcome's field).
    servers = links.remote_servers_for(node) if hello.resources is not None else None
    return StreamInfo(stream_pk=stream.pk, node_id=node.pk, node_name=node.name,
                      acked_seq=stream.last_seq, gpu_ids=gpu_ids, remote_servers=servers)
