"""The agent consumer in-process (in-memory channel layer): session rules of wire/PROTOCOL.md."""

from __future__ import annotations

import time
import uuid

import pytest
from asgiref.sync import sync_to_async

from portal.fleet.services import issue_node_token
from portal.telemetry.models import AgentStream

from .conftest import agent_socket, hello_for, samples_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("memory_layer")]


@pytest.fixture
def token(node):
    return issue_node_token(node)


async def _next(communicator, kind: str) -> dict:
    while True:
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == kind:
            return message


async def _hello(communicator, node) -> tuple[str, dict]:
    hello = await sync_to_async(hello_for)(node)
    await communicator.send_to(text_data=hello.model_dump_json())
    return hello.stream, await _next(communicator, "welcome")


async def test_samples_before_hello_are_refused_and_close(node, token):
    communicator = await agent_socket(token)
    stream = str(uuid.uuid4())
    batch = await sync_to_async(samples_for)(node, stream, range(1, 2))
    await communicator.send_to(text_data=batch.model_dump_json())
    error = await _next(communicator, "error")
    assert (error["code"], error["fatal"]) == ("unexpected_message", True)
    assert (await communicator.receive_output(timeout=5))["code"] == 4008


async def test_a_second_hello_is_refused(node, token):
    communicator = await agent_socket(token)
    await _hello(communicator, node)
    await _next(communicator, "placements")
    hello = await sync_to_async(hello_for)(node)
    await communicator.send_to(text_data=hello.model_dump_json())
    assert (await _next(communicator, "error"))["code"] == "unexpected_message"


async def test_replays_are_acked_and_stored_once_and_wrong_streams_refused(node, token):
    communicator = await agent_socket(token)
    stream, welcome = await _hello(communicator, node)
    assert welcome["acked_seq"] == 0
    for seqs in (range(1, 4), range(2, 6)):
        batch = await sync_to_async(samples_for)(node, stream, seqs)
        await communicator.send_to(text_data=batch.model_dump_json())
        assert (await _next(communicator, "ack"))["seq"] == seqs[-1]
    other = await sync_to_async(samples_for)(node, str(uuid.uuid4()), range(6, 7))
    await communicator.send_to(text_data=other.model_dump_json())
    error = await _next(communicator, "error")
    assert (error["code"], error["fatal"], error["ref_seq"]) == ("invalid_message", False, 6)
    future = await sync_to_async(samples_for)(node, stream, range(6, 7), ts_ms=int(time.time() * 1000) + 3_600_000)
    await communicator.send_to(text_data=future.model_dump_json())
    assert "in the future" in (await _next(communicator, "error"))["message"]
    stored = await sync_to_async(AgentStream.objects.get)(stream=stream)
    assert stored.last_seq == 5
    await communicator.disconnect()


async def test_a_newer_connection_of_the_node_supersedes_the_older(node, token):
    old = await agent_socket(token)
    await _hello(old, node)
    new = await agent_socket(token)
    await _hello(new, node)
    while True:
        output = await old.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            break
    assert output["code"] == 4409
    await new.disconnect()
