"""Agents report the links they measured (wire `links`): stored whole, replacing the node's last
report, read by placement; a report naming an unknown node or the sender itself is refused whole."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import sync_to_async

from portal.fleet.models import Node, NodeLink
from portal.fleet.services import issue_node_token
from portal.placement import snapshot
from wire.agent_portal import MAX_LINKS

from .conftest import agent_socket, hello_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("memory_layer")]


async def _next(communicator, kind: str) -> dict:
    while True:
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == kind:
            return message


def _links(*readings) -> str:
    now = int(time.time() * 1000)
    return json.dumps({"v": 1, "type": "links", "links": [
        {"gpu_node": name, "rtt_ms": rtt, "bandwidth_mbps": mbps, "ts_ms": now} for name, rtt, mbps in readings]})


def _stored() -> dict:
    return {(c, g): (rtt, mbps) for c, g, rtt, mbps in NodeLink.objects.values_list(
        "client__name", "gpu_node__name", "rtt_ms", "bandwidth_mbps")}


async def test_links_are_stored_replaced_and_read_by_placement(node):
    cpu = await sync_to_async(Node.objects.create)(name="cpu-1", cpu_milli=8000, memory_mib=32768)
    token = await sync_to_async(issue_node_token)(cpu)
    communicator = await agent_socket(token)
    hello = await sync_to_async(hello_for)(cpu)
    await communicator.send_to(text_data=hello.model_dump_json())
    await _next(communicator, "welcome")

    await communicator.send_to(text_data=_links((node.name, 0.25, 9400.0)))
    # Not acknowledged: the next message's answer shows the report was handled before it.
    await communicator.send_to(text_data=_links(("cpu-1", 0.1, 10.0)))
    error = await _next(communicator, "error")
    assert error["code"] == "invalid_message" and not error["fatal"]
    assert error["message"] == "links: links[0].gpu_node: cpu-1 is this node; a link joins two nodes"
    assert await sync_to_async(_stored)() == {("cpu-1", node.name): (0.25, 9400.0)}
    links = await sync_to_async(snapshot.links)()
    assert links[("cpu-1", node.name)].bandwidth_mbps == 9400.0

    await communicator.send_to(text_data=_links((node.name, 0.3, 9000.0), ("nowhere", 0.1, 100.0)))
    error = await _next(communicator, "error")
    assert error["message"] == "links: links[1].gpu_node: no node 'nowhere' in the portal's fleet"
    assert await sync_to_async(_stored)() == {("cpu-1", node.name): (0.25, 9400.0)}  # refused whole

    too_many = _links(*[(f"gpu-{i}", 0.1, 100.0) for i in range(MAX_LINKS + 1)])
    await communicator.send_to(text_data=too_many)
    error = await _next(communicator, "error")
    assert error["code"] == "invalid_message" and "at most 64 items" in error["message"]
    bad = json.loads(_links((node.name, -1, 100.0)))
    await communicator.send_to(text_data=json.dumps(bad))
    assert "rtt_ms" in (await _next(communicator, "error"))["message"]

    await communicator.send_to(text_data=_links())  # the complete set: none now
    await communicator.send_to(text_data=_links(("cpu-1", 0.1, 10.0)))
    await _next(communicator, "error")
    assert await sync_to_async(_stored)() == {}
    await communicator.disconnect()
