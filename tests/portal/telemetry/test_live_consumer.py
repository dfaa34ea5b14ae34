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


async def test_only_site_admins_may_watch_the_fleet(people):
    for name in ("alice", "carol", "dave"):  # a member, a team admin, a manager
        communicator = await _open(people[name])
        assert (await communicator.connect())[0]
        await communicator.send_json_to({"subscribe": ["fleet"]})
        answer = await communicator.receive_json_from()
        assert answer["groups"] == [] and answer["refused"] == {"fleet": "not found or not visible to you"}, name
        await communicator.disconnect()
    communicator = await _open(people["admin"])
    assert (await communicator.connect())[0]
    await communicator.send_json_to({"subscribe": ["fleet"]})
    assert (await communicator.receive_json_from())["groups"] == ["fleet"]
    await communicator.disconnect()


async def test_the_fleet_group_hears_a_node_drained_lost_and_a_share_placed(people, teams, fleet):
    from decimal import Decimal

    from django.db import transaction

    from portal.audit import services as audit
    from portal.fleet import services as fleet_services
    from portal.fleet.models import Gpu, LostCause, Node
    from portal.reservations import rules, services

    node = await sync_to_async(Node.objects.get)(name="a100-node-1")
    other = await sync_to_async(Node.objects.get)(name="t4-node-1")
    communicator = await _open(people["admin"])
    assert (await communicator.connect())[0]
    await communicator.send_json_to({"subscribe": ["fleet"]})
    assert (await communicator.receive_json_from())["groups"] == ["fleet"]

    await sync_to_async(fleet_services.drain)(node.pk, audit.web(people["admin"]), "disk swap")
    first = await communicator.receive_json_from(timeout=5)
    assert (first["type"], first["data"]["changed"]) == ("nodes", [node.pk])
    await sync_to_async(fleet_services.mark_lost)(other.pk, LostCause.AGENT_SILENT, "no agent report for 30 s")
    second = await communicator.receive_json_from(timeout=5)
    assert second["data"]["changed"] == [other.pk] and second["seq"] == first["seq"] + 1

    def place() -> tuple[Node, int]:
        gpu = Gpu.objects.filter(node__status="ready").select_related("node").first()
        with transaction.atomic():  # the cycle the submit asks for, after commit, finds it placed
            r = services.submit(people["alice"], rules.ReservationSpec(
                team=teams["vision"], image="img", gpu_request=Decimal("0.25"), gpu_memory_mib=1024))
            services.place(r.pk, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.25"), 1024)])
        return gpu.node, r.pk

    ready, rid = await sync_to_async(place)()
    third = await communicator.receive_json_from(timeout=5)
    assert third["data"]["changed"] == [ready.pk]
    # Its reservation's state changed with it (placed): the same node again, nothing else.
    while not await communicator.receive_nothing(timeout=1):
        assert (await communicator.receive_json_from())["data"]["changed"] == [ready.pk]

    # The share starts running: no allocation changes, but its slice on that node says so.
    await sync_to_async(services.move)(rid, "placed", "running", "its pod runs")
    fourth = await communicator.receive_json_from(timeout=5)
    assert fourth["data"]["changed"] == [ready.pk]
    await communicator.disconnect()
