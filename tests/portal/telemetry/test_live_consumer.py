"""The browser consumer on its own (in-memory channel layer): sign-in required, subscriptions
checked, messages only for joined groups, and a membership removed while the page stays open."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from portal.telemetry.consumers import LiveConsumer
from portal.tenancy.models import Membership

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(autouse=True)
def _memory_layer(settings):
    from channels.layers import channel_layers

    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def _open(user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    return communicator


async def test_anonymous_is_refused():
    communicator = await _open(AnonymousUser())
    connected, _ = await communicator.connect()
    assert not connected


async def test_bad_requests_are_answered_and_the_socket_stays(people, teams):
    communicator = await _open(people["alice"])
    assert (await communicator.connect())[0]
    for bad in ("nope", "[]", '{"subscribe": "team:1"}', '{"watch": []}', json.dumps({"subscribe": ["x"] * 201})):
        await communicator.send_to(text_data=bad)
        assert (await communicator.receive_json_from())["type"] == "error"
    await communicator.send_json_to({"subscribe": [f"team:{teams['vision'].pk}"]})
    assert (await communicator.receive_json_from())["groups"] == [f"team:{teams['vision'].pk}"]
    await communicator.disconnect()


async def test_a_removed_member_stops_receiving(people, teams, monkeypatch):
    monkeypatch.setattr(LiveConsumer, "RECHECK_S", 0.2)
    group = f"team:{teams['vision'].pk}"
    communicator = await _open(people["alice"])
    assert (await communicator.connect())[0]
    await communicator.send_json_to({"subscribe": [group, f"team:{teams['nlp'].pk}"]})
    answer = await communicator.receive_json_from()
    assert answer["groups"] == [group] and list(answer["refused"]) == [f"team:{teams['nlp'].pk}"]
    layer = get_channel_layer()
    await layer.group_send(f"live.team.{teams['vision'].pk}",
                           {"type": "live.message", "group": group, "text": json.dumps({"group": group, "seq": 1})})
    assert (await communicator.receive_json_from())["seq"] == 1
    await sync_to_async(Membership.objects.filter(user=people["alice"], team=teams["vision"]).delete)()
    assert await communicator.receive_json_from(timeout=5) == {"type": "revoked", "groups": [group]}
    await layer.group_send(f"live.team.{teams['vision'].pk}",
                           {"type": "live.message", "group": group, "text": json.dumps({"group": group, "seq": 2})})
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


async def test_a_flooding_browser_is_closed(people):
    communicator = await _open(people["alice"])
    assert (await communicator.connect())[0]
    for _ in range(60):
        await communicator.send_json_to({"unsubscribe": []})
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            break
    assert output["code"] == 4429
