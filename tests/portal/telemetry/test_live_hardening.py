"""ws/live/ under abuse and on a bad day: a frame nested too deeply closes the socket cleanly
(4400, not 1011), a handler's error closes it (4011), the background task ends on every way out
(no query for a client that is gone), and a signed-out session or a deactivated user loses the
socket within the re-check interval."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from portal.telemetry import live
from portal.telemetry.consumers import LiveConsumer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
RECHECK_S = 0.1


@pytest.fixture(autouse=True)
def _memory_layer_and_quick_rechecks(settings, monkeypatch):
    from channels.layers import channel_layers

    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    monkeypatch.setattr(LiveConsumer, "RECHECK_S", RECHECK_S)
    yield
    channel_layers.backends.clear()


@pytest.fixture
def rechecks(monkeypatch):
    """How many times any connection's background task has looked at the database."""
    calls = []
    original = LiveConsumer.still_signed_in

    def counted(self):
        calls.append(1)
        return original(self)

    monkeypatch.setattr(LiveConsumer, "still_signed_in", counted)
    return calls


async def _quiet_after_close(rechecks) -> None:
    seen = len(rechecks)
    await asyncio.sleep(RECHECK_S * 6)
    assert len(rechecks) == seen, "the background task still queries for a client that is gone"


async def _open(user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    assert (await communicator.connect())[0]
    return communicator


async def _close_code(communicator) -> int:
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            return output["code"]


@pytest.mark.parametrize("frame", ["[" * 5000, '{"subscribe": ' + "[" * 8000 + "]" * 8000 + "}"])
async def test_deeply_nested_json_closes_cleanly_and_stops_the_task(people, rechecks, frame):
    communicator = await _open(people["alice"])
    await asyncio.sleep(RECHECK_S * 3)
    assert rechecks, "the re-check runs while the socket is open"
    await communicator.send_to(text_data=frame)
    assert (await communicator.receive_json_from())["message"] == "JSON nested too deeply"
    assert await _close_code(communicator) == 4400
    await _quiet_after_close(rechecks)


async def test_an_error_in_a_handler_closes_with_4011_and_stops_the_task(people, teams, rechecks, monkeypatch):
    def broken(name):
        raise RuntimeError("a bug")

    monkeypatch.setattr(live, "parse_group", broken)
    communicator = await _open(people["alice"])
    await communicator.send_json_to({"subscribe": ["team:1"]})
    assert await _close_code(communicator) == 4011
    await _quiet_after_close(rechecks)


async def test_a_client_that_goes_away_leaves_no_task(people, rechecks):
    communicator = await _open(people["alice"])
    await asyncio.sleep(RECHECK_S * 2)
    await communicator.disconnect()
    await _quiet_after_close(rechecks)


async def test_a_client_that_vanishes_mid_handler_leaves_no_task(people, rechecks):
    communicator = await _open(people["alice"])
    await asyncio.sleep(RECHECK_S * 2)
    communicator.future.cancel()  # the server's connection task is torn down (the socket dropped)
    await asyncio.sleep(0)
    await _quiet_after_close(rechecks)


async def _open_with_session(user) -> tuple[WebsocketCommunicator, Client]:
    browser = Client()
    await sync_to_async(browser.force_login)(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"
    communicator = WebsocketCommunicator(AuthMiddlewareStack(LiveConsumer.as_asgi()), "/ws/live/",
                                         headers=[(b"cookie", cookie.encode())])
    assert (await communicator.connect())[0]
    return communicator, browser


async def test_signing_out_closes_the_live_socket(people):
    communicator, browser = await _open_with_session(people["alice"])
    assert await communicator.receive_nothing(timeout=RECHECK_S * 4)  # still signed in: stays open
    await sync_to_async(browser.logout)()
    assert (await communicator.receive_json_from(timeout=5))["type"] == "signed_out"
    assert await _close_code(communicator) == 4401


async def test_deactivating_the_user_closes_the_live_socket(people):
    communicator, _ = await _open_with_session(people["bob"])
    people["bob"].is_active = False
    await sync_to_async(people["bob"].save)()
    assert (await communicator.receive_json_from(timeout=5))["type"] == "signed_out"
    assert await _close_code(communicator) == 4401


async def test_changing_the_password_elsewhere_closes_the_live_socket(people):
    communicator, _ = await _open_with_session(people["carol"])
    people["carol"].set_password("a-brand-new-one")
    await sync_to_async(people["carol"].save)()
    assert await _close_code(communicator) == 4401
