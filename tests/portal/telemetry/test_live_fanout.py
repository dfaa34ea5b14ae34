"""Live fan-out after each commit: it never holds up storage or acks, and each group's messages
stay numbered one after another."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, channel_layers
from channels.testing import WebsocketCommunicator

from portal.fleet.models import Gpu
from portal.fleet.services import issue_node_token
from portal.telemetry import dbthread, live, writer
from portal.telemetry.consumers import AgentConsumer
from portal.telemetry.models import AgentStream

from .conftest import hello_for, samples_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


class StalledRedis(InMemoryChannelLayer):
    """A channel layer whose live-group sends hang until `opened` is set, like a Redis that has
    stopped answering."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()

    async def group_send(self, group, message):
        if group.startswith("live."):
            await self.opened.wait()
        await super().group_send(group, message)


@pytest.fixture
def layer(settings, monkeypatch):
    settings.REDIS_URL = ""
    settings.TESSERA_TELEMETRY_TICKER = False
    live.watching.forget()  # watched groups and sequence numbers in memory
    channel_layers.backends.clear()
    channel_layers.backends["default"] = stalled = StalledRedis()
    yield stalled
    channel_layers.backends.clear()
    dbthread.close_connections()
    writer.close_connections()


async def _next(communicator, kind: str) -> dict:
    while True:
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == kind:
            return message


async def test_a_stalled_live_fanout_holds_up_neither_storage_nor_acks(layer, node):
    gpu = await sync_to_async(lambda: Gpu.objects.get(node=node, index=0).pk)()
    group = live.Group("gpu", gpu)
    browser = await layer.new_channel()
    await layer.group_add(group.channel_group, browser)
    await live.store().watch([group.name])

    token = await sync_to_async(issue_node_token)(node)
    agent = WebsocketCommunicator(AgentConsumer.as_asgi(), "/ws/agents/",
                                  headers=[(b"authorization", f"Bearer {token}".encode())])
    assert (await agent.connect())[0]
    hello = await sync_to_async(hello_for)(node)
    await agent.send_to(text_data=hello.model_dump_json())
    await _next(agent, "welcome")

    batches = [await sync_to_async(samples_for)(node, hello.stream, range(seq, seq + 1), util=util)
               for seq, util in ((1, 10), (2, 20), (3, 30))]
    for batch in batches:
        await agent.send_to(text_data=batch.model_dump_json())
        # Acked while the first publish still hangs: the next commit does not wait for it.
        assert (await _next(agent, "ack"))["seq"] == batch.samples[-1].seq
    stream = await sync_to_async(AgentStream.objects.get)(stream=hello.stream)
    assert stream.last_seq == 3

    layer.opened.set()
    messages: list[dict] = []
    while not messages or messages[-1]["data"]["sm_util_pct"] != 30:
        event = await asyncio.wait_for(layer.receive(browser), 5)
        messages.append(json.loads(event["text"]))
    # The stalled reading goes first; those that piled up behind it go out together (the
    # newest wins), and the group's numbers still follow one another: no gap for a browser to mend.
    assert messages[0]["data"]["sm_util_pct"] == 10
    assert [m["seq"] for m in messages] == list(range(1, len(messages) + 1))
    await agent.disconnect()
