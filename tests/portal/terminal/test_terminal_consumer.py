"""ws/terminal/<id>/ in-process (in-memory channel layer, a local cluster whose pods get a real
shell on a real PTY): the owner gets a shell with the pod's environment; everybody else is
refused as if the reservation did not exist; frames are bounded; the terminal closes when the
reservation ends, after idling, and beyond the per-user limit."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import connections, transaction
from django.urls import path

from portal.fleet.models import Gpu
from portal.placement.backend import forget_backends, get_backend, use_backend
from portal.placement.binding import bind
from portal.reservations import services
from portal.reservations.models import Reservation, StateTransition
from portal.reservations.states import State
from portal.terminal.consumer import TerminalConsumer
from scheduler.backends.local import LocalBackend
from tests.reservations import SYSTEM, placed, submitted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.timeout(60)]

APP = URLRouter([path("ws/terminal/<int:reservation_id>/", TerminalConsumer.as_asgi())])


@pytest.fixture(autouse=True)
def _memory_layer(settings):
    from channels.layers import channel_layers

    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.TESSERA_TERMINAL_CHECK_S = 0.2
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest_asyncio.fixture(autouse=True)
async def _close_database_thread():
    yield
    # The consumer's queries ran in the one thread sync_to_async keeps: its connection is closed
    # there, or the test database cannot be dropped at the end.
    await sync_to_async(connections.close_all)()


@pytest.fixture
def cluster(settings, fleet):
    settings.TESSERA_BACKEND = "local"
    use_backend(LocalBackend(start_delay_s=0))
    backend = get_backend()  # adds the fleet's nodes
    yield backend
    forget_backends()


@pytest.fixture
def shell_for(cluster, teams):
    """A running reservation of `owner` whose pod runs on the local cluster."""

    def make(owner, share: str = "0.25") -> Reservation:
        gpu = Gpu.objects.get(node__name="a100-node-1", index=0)
        with transaction.atomic():
            r = placed(submitted(owner, teams["vision"], image="img", gpu_request=Decimal(share),
                                 gpu_memory_mib=4096), gpu)
        bind(cluster, r.pk)
        cluster.list_pods()  # the pod has started (start delay 0)
        services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", SYSTEM)
        return Reservation.objects.get(pk=r.pk)

    return make


async def _open(user, reservation_id: int, query: str = "") -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(APP, f"/ws/terminal/{reservation_id}/{query}")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=10)
    return communicator, connected


async def _text(communicator) -> dict:
    """The next control message, passing over output."""
    while True:
        message = await communicator.receive_output(timeout=10)
        if message["type"] == "websocket.send" and message.get("text") is not None:
            return json.loads(message["text"])
        if message["type"] == "websocket.close":
            raise AssertionError(f"closed ({message.get('code')}) before a control message")


async def _output_until(communicator, needle: bytes) -> bytes:
    """The shell's output up to and including `needle` (the wait ends when it comes)."""
    seen = b""
    while needle not in seen:
        message = await communicator.receive_output(timeout=10)
        assert message["type"] == "websocket.send", message
        seen += message.get("bytes") or b""
    return seen


async def _closed(communicator) -> tuple[dict, int]:
    """(the last control message, the close code)."""
    said = None
    while True:
        message = await communicator.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            return said, message.get("code")
        if message.get("text") is not None:
            said = json.loads(message["text"])


async def test_owner_gets_a_shell_with_the_pods_environment(people, shell_for):
    r = await sync_to_async(shell_for)(people["alice"], "0.25")
    communicator, connected = await _open(people["alice"], r.pk)
    assert connected
    said = await _text(communicator)
    if said["type"] != "ready":  # the message says why not; the transitions say who moved it
        moves = await sync_to_async(list)(StateTransition.objects.filter(reservation_id=r.pk)
                                          .values_list("to_state", "reason", "actor_label"))
        raise AssertionError(f"{said}; transitions {moves}")
    await communicator.send_to(bytes_data=b'echo "share=$TESSERA_GPU_REQUEST db=${DATABASE_URL:-none}"\n')
    output = await _output_until(communicator, b"db=none")
    assert b"share=0.25 db=none" in output  # the pod's variables, none of the portal's
    rows = await sync_to_async(list)(StateTransition.objects.filter(reservation_id=r.pk, reason="terminal opened")
                                     .values_list("actor_label", flat=True))
    assert rows == ["alice"]
    await communicator.disconnect()


async def test_the_window_size_follows_the_browser(people, shell_for):
    r = await sync_to_async(shell_for)(people["alice"])
    communicator, _ = await _open(people["alice"], r.pk, "?rows=30&cols=90")
    await _text(communicator)
    await communicator.send_to(bytes_data=b"stty size\n")
    await _output_until(communicator, b"30 90")
    await communicator.send_to(text_data=json.dumps({"type": "resize", "rows": 40, "cols": 120}))
    await communicator.send_to(bytes_data=b"stty size\n")
    await _output_until(communicator, b"40 120")
    await communicator.send_to(text_data=json.dumps({"type": "resize", "rows": 0, "cols": 120}))
    assert (await _text(communicator))["type"] == "error"  # said, and the terminal stays
    await communicator.send_to(bytes_data=b"echo still-$((6*7))\n")
    await _output_until(communicator, b"still-42")
    await communicator.disconnect()


@pytest.mark.parametrize("who", ["alice2", "carol", "bob", "erin", "admin", "anonymous"])
async def test_anybody_but_the_owner_is_refused_as_if_it_did_not_exist(people, shell_for, who):
    """A team-mate, the team's admin, another team's member and admin, a site admin, nobody."""
    r = await sync_to_async(shell_for)(people["alice"])
    user = AnonymousUser() if who == "anonymous" else people[who]
    _, connected = await _open(user, r.pk)
    assert not connected
    _, connected = await _open(people["alice"], r.pk + 1000)  # no such reservation: the same refusal
    assert not connected


async def test_a_frame_over_the_limit_closes_the_terminal(people, shell_for, settings):
    r = await sync_to_async(shell_for)(people["alice"])
    communicator, _ = await _open(people["alice"], r.pk)
    await _text(communicator)
    await communicator.send_to(bytes_data=b"x" * (64 * 1024))  # at the limit: taken
    await communicator.send_to(bytes_data=b"x" * (64 * 1024 + 1))
    said, code = await _closed(communicator)
    assert code == 1009 and said["type"] == "error" and "64 KiB" in said["message"]


async def test_the_terminal_closes_when_the_reservation_ends(people, shell_for):
    r = await sync_to_async(shell_for)(people["alice"])
    communicator, _ = await _open(people["alice"], r.pk)
    await _text(communicator)
    await communicator.send_to(bytes_data=b"echo before-$((40+2))\n")
    await _output_until(communicator, b"before-42")
    await sync_to_async(services.cancel)(r.pk, people["alice"])
    said, code = await _closed(communicator)
    assert code == 4410 and "cancelled" in said["message"]


async def test_a_reservation_not_running_yet_tells_its_owner(people, teams, cluster):
    r = await sync_to_async(submitted)(people["alice"], teams["vision"], gpu_request=Decimal("0.25"),
                                       gpu_memory_mib=4096)
    communicator, connected = await _open(people["alice"], r.pk)
    assert connected  # the owner is told why, nobody else learns anything
    said, code = await _closed(communicator)
    # pending, or placed already by the cycle its submission asked for: not running either way
    assert code == 4409 and "a terminal opens once it is running" in said["message"]


async def test_at_most_n_terminals_per_user(people, shell_for, settings):
    settings.TESSERA_TERMINAL_PER_USER = 1
    r = await sync_to_async(shell_for)(people["alice"])
    first, _ = await _open(people["alice"], r.pk)
    assert (await _text(first))["type"] == "ready"
    second, _ = await _open(people["alice"], r.pk)
    said, code = await _closed(second)
    assert code == 4429 and "You have 1 terminal open already" in said["message"]
    await first.disconnect()
    third, _ = await _open(people["alice"], r.pk)  # the first one's slot is free again
    assert (await _text(third))["type"] == "ready"
    await third.disconnect()


async def test_an_idle_terminal_closes(people, shell_for, settings):
    settings.TESSERA_TERMINAL_IDLE_S = 0.5
    r = await sync_to_async(shell_for)(people["alice"])
    communicator, _ = await _open(people["alice"], r.pk)
    said, code = await _closed(communicator)
    assert code == 4408 and "without input" in said["message"]


async def test_the_shell_exiting_closes_the_terminal(people, shell_for):
    r = await sync_to_async(shell_for)(people["alice"])
    communicator, _ = await _open(people["alice"], r.pk)
    await _text(communicator)
    await communicator.send_to(bytes_data=b"exit\n")
    said, code = await _closed(communicator)
    assert code == 1000 and said == {"type": "closed", "message": "The shell exited."}


async def test_output_comes_in_bounded_frames(people, shell_for, settings):
    settings.TESSERA_TERMINAL_OUTPUT_CHUNK_BYTES = 1024
    r = await sync_to_async(shell_for)(people["alice"])
    communicator, _ = await _open(people["alice"], r.pk)
    await _text(communicator)
    await communicator.send_to(bytes_data=b"head -c 50000 /dev/zero | tr '\\0' a; echo; echo end-$((6*7))\n")
    frames = []
    while b"end-42" not in b"".join(frames):
        message = await communicator.receive_output(timeout=10)
        frames.append(message.get("bytes") or b"")
    assert max(map(len, frames)) <= 1024
    assert b"".join(frames).count(b"a" * 1000) >= 50  # all of it, in more frames than one
    await communicator.disconnect()


async def test_the_reservations_live_message_closes_it_without_waiting_for_a_look(people, shell_for, settings,
                                                                                  redis_channel_layer):
    """Through Redis, as between portal processes: the change's push to the reservation's group
    closes the terminal; the periodic look (an hour away here) is not what does it."""
    import os

    url = f"redis://127.0.0.1:6379/{int(os.environ.get('TESSERA_TEST_REDIS_DB', '7'))}"
    await sync_to_async(redis_channel_layer)(url)
    settings.REDIS_URL = url
    settings.TESSERA_TERMINAL_CHECK_S = 3600
    r = await sync_to_async(shell_for)(people["alice"])
    communicator, _ = await _open(people["alice"], r.pk)
    assert (await _text(communicator))["type"] == "ready"
    await sync_to_async(services.cancel)(r.pk, people["alice"])
    said, code = await _closed(communicator)
    assert code == 4410 and "cancelled" in said["message"]
