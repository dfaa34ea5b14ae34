"""ws/agents/ under abuse: a frame nested too deeply is refused like any bad frame (the socket
stays), and an error inside a handler closes the connection with 4011 instead of an exception."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from portal.fleet.services import issue_node_token
from portal.telemetry import agent_batches
from wire.agent_portal import AGENT_MESSAGES, ProtocolError, parse

from .conftest import agent_socket, hello_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("memory_layer")]


async def _agent(node):
    return await agent_socket(await sync_to_async(issue_node_token)(node))


async def _close_code(communicator) -> int:
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            return output["code"]


@pytest.mark.parametrize("frame", ["[" * 100_000, '{"v": 1, "type": "hello", "gpus": ' + "[" * 50_000 + "}"])
def test_the_protocol_refuses_deep_nesting_as_bad_json(frame):
    with pytest.raises(ProtocolError) as exc:
        parse(frame, AGENT_MESSAGES)
    assert exc.value.code == "bad_json" and "nested too deeply" in str(exc.value)


async def test_deeply_nested_frame_after_hello_is_answered_and_the_socket_stays(node):
    communicator = await _agent(node)
    hello = await sync_to_async(hello_for)(node)
    await communicator.send_to(text_data=hello.model_dump_json())
    while (await communicator.receive_json_from(timeout=5))["type"] != "welcome":
        pass
    await communicator.send_to(text_data="[" * 200_000)
    while True:
        answer = await communicator.receive_json_from(timeout=5)
        if answer["type"] == "error":
            break
    assert answer["code"] == "bad_json" and not answer.get("fatal")
    await communicator.disconnect()


async def test_an_error_in_a_handler_closes_with_4011(node, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(agent_batches, "too_far_ahead", broken)
    communicator = await _agent(node)
    hello = await sync_to_async(hello_for)(node)
    await communicator.send_to(text_data=hello.model_dump_json())
    from .conftest import samples_for

    message = await sync_to_async(samples_for)(node, hello.stream, range(1, 2))
    await communicator.send_to(text_data=message.model_dump_json())
    assert await _close_code(communicator) == 4011
