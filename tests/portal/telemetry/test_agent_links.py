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


async def test_an_agent_without_gpus_reports_its_resources_and_is_told_which_servers_to_probe(node):
    from portal.fleet import services as fleet_services
    from portal.fleet.models import LostCause

    cpu = await sync_to_async(Node.objects.create)(name="cpu-2")
    token = await sync_to_async(issue_node_token)(cpu)
    await sync_to_async(fleet_services.record_addresses)({node.name: "10.0.0.11"})  # as the cluster reports it
    lost = await sync_to_async(Node.objects.get)(name="t4-node-1")
    await sync_to_async(fleet_services.mark_lost)(lost.pk, LostCause.CLUSTER_NOT_READY, "gone")
    hello = {"v": 1, "type": "hello", "node": "cpu-2", "stream": "6c0a8c5e-2f7e-4d55-9a43-6f1b8c1d2e3f",
             "agent_version": "0.1.0", "source": "none", "driver_version": None, "interval_ms": 10000,
             "gpus": [], "resources": {"cpu_milli": 32000, "memory_mib": 120000}}
    communicator = await agent_socket(token)
    await communicator.send_to(text_data=json.dumps(hello))
    welcome = await _next(communicator, "welcome")
    servers = {s["node"]: s["address"] for s in welcome["remote_servers"]}
    # Every GPU node but the lost one, at the address the cluster reports (else its name), port 7470.
    gpu_nodes = await sync_to_async(lambda: set(Node.objects.exclude(gpus=None).values_list("name", flat=True)))()
    assert set(servers) == gpu_nodes - {"t4-node-1"} and "cpu-2" not in servers
    assert servers[node.name] == "10.0.0.11:7470"
    assert all(address == f"{name}:7470" for name, address in servers.items() if name != node.name)
    # During the session: a GPU node lost, then back, another one moved; the agent hears each list.
    await sync_to_async(fleet_services.mark_lost)(node.pk, LostCause.CLUSTER_NOT_READY, "gone")
    pushed = await _next(communicator, "servers")
    assert {s["node"] for s in pushed["remote_servers"]} == set(servers) - {node.name}
    await sync_to_async(fleet_services.mark_back)(lost.pk, LostCause.CLUSTER_NOT_READY)
    pushed = await _next(communicator, "servers")
    assert {s["node"] for s in pushed["remote_servers"]} == set(servers) - {node.name} | {"t4-node-1"}
    await sync_to_async(fleet_services.record_addresses)({"t4-node-1": "10.0.0.12"})
    pushed = await _next(communicator, "servers")
    assert {"node": "t4-node-1", "address": "10.0.0.12:7470"} in pushed["remote_servers"]
    await communicator.disconnect()
    cpu = await sync_to_async(Node.objects.get)(pk=cpu.pk)
    assert (cpu.cpu_milli, cpu.memory_mib) == (32000, 120000)

    # An agent that does not report resources (older, or simulated) gets the welcome it knows.
    communicator = await agent_socket(token)
    del hello["resources"]
    await communicator.send_to(text_data=json.dumps({**hello, "stream": "7d1b9d6f-3a8f-4e66-8b54-7a2c9d2e3f40"}))
    assert "remote_servers" not in await _next(communicator, "welcome")
    await communicator.disconnect()
