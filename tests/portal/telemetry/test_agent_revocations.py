"""A GPU node's agent hears which remote shares served from its GPUs ended (wire/PROTOCOL.md 5.5),
so their tokens stop working at once: at its hello and whenever a share leaves the node."""

from __future__ import annotations

from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from portal.fleet.models import Gpu
from portal.fleet.services import issue_node_token
from portal.reservations import services
from portal.reservations.models import Reservation, Sharing
from portal.reservations.states import State
from portal.telemetry.services import revoked_shares_for_node
from tests.reservations import SYSTEM

from .conftest import agent_socket, hello_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("memory_layer")]


@pytest.fixture
def token(node):
    return issue_node_token(node)


@pytest.fixture
def remote(placed):
    """vision's share is a remote one (its pod on another node); nlp's is local."""
    Reservation.objects.filter(pk=placed["vision"].pk).update(sharing=Sharing.REMOTE)
    Reservation.objects.filter(pk=placed["nlp"].pk).update(sharing=Sharing.LOCAL)
    return placed


async def _connect(token, node, revocations: bool = True):
    communicator = await agent_socket(token)
    hello = await sync_to_async(hello_for)(node)
    hello = hello.model_copy(update={"revocations": revocations})
    await communicator.send_to(text_data=hello.model_dump_json())
    return communicator


async def _messages(communicator) -> list[dict]:
    """Everything the portal sent until it went quiet."""
    got = []
    while not await communicator.receive_nothing(timeout=0.5):
        got.append(await communicator.receive_json_from(timeout=5))
    return got


def _revoked(messages) -> list[list[dict]]:
    return [m["shares"] for m in messages if m["type"] == "revoked_shares"]


async def _changed(node) -> None:
    # What the allocations_changed signal sends the node's agents after a commit.
    await get_channel_layer().group_send(f"agent.node.{node.pk}", {"type": "placements.changed"})


async def test_a_released_remote_share_is_revoked_and_a_local_one_is_not(node, token, remote):
    communicator = await _connect(token, node)
    assert _revoked(await _messages(communicator)) == [[]]  # at hello: nothing ended yet
    await sync_to_async(services.release)(remote["nlp"].pk, State.SUCCEEDED, "done", SYSTEM)
    await sync_to_async(services.release)(remote["vision"].pk, State.CANCELLED, "by its owner", SYSTEM)
    await _changed(node)
    shares = _revoked(await _messages(communicator))
    assert [[s["share"] for s in listed] for listed in shares] == [[str(remote["vision"].pk)]]
    await _changed(node)  # nothing new: not sent again
    assert _revoked(await _messages(communicator)) == []
    await communicator.disconnect()

    # A restarted agent hears it at its hello.
    communicator = await _connect(token, node)
    assert [[s["share"] for s in listed] for listed in _revoked(await _messages(communicator))] == [
        [str(remote["vision"].pk)]]
    await communicator.disconnect()


def _requeue_and_place(reservation_id: int, gpu: Gpu, *, preempted: bool) -> None:
    # One transaction: the cycle it asks for after the commit finds nothing left to place.
    with transaction.atomic():
        if preempted:
            assert services.move(reservation_id, [State.PLACED, State.RUNNING], State.PREEMPTED, "reclaimed", SYSTEM)
        assert services.move(reservation_id, [State.PLACED, State.RUNNING, State.PREEMPTED], State.PENDING, "requeued",
                             SYSTEM)
        services.place(reservation_id, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.5"), 4096)])


async def test_a_requeued_share_stays_revoked_here_and_placed_here_again_only_its_new_attempt_is_valid(
        node, token, remote):
    """Preempted and requeued, placed on another node: the token its old pod held for this node's
    server must still be refused (every attempt so far is void); placed here again, its new token
    must work and the old one still not (only the attempts before the current one are void)."""
    vision = remote["vision"]
    elsewhere = await sync_to_async(Gpu.objects.exclude(node=node).first)()
    here = await sync_to_async(Gpu.objects.get)(node=node, index=2)
    communicator = await _connect(token, node)
    await _messages(communicator)
    first = vision.attempt
    await sync_to_async(_requeue_and_place)(vision.pk, elsewhere, preempted=True)
    await _changed(node)
    assert [[(s["share"], s["from_attempt"]) for s in listed] for listed in _revoked(await _messages(communicator))
            ] == [[(str(vision.pk), first + 2)]]  # the attempt elsewhere is first + 1: nothing valid here
    await sync_to_async(_requeue_and_place)(vision.pk, here, preempted=False)
    await _changed(node)
    # Its attempt here is first + 2: the list the agent has lets that token in already, and keeps
    # the older ones out; it is not sent again.
    assert _revoked(await _messages(communicator)) == []
    now = await sync_to_async(revoked_shares_for_node)(node.pk)
    assert [(s.share, s.from_attempt) for s in now.shares] == [(str(vision.pk), first + 2)]
    await communicator.disconnect()


async def test_an_agent_that_did_not_ask_is_never_sent_revocations(node, token, remote):
    await sync_to_async(services.release)(remote["vision"].pk, State.CANCELLED, "by its owner", SYSTEM)
    communicator = await _connect(token, node, revocations=False)
    assert _revoked(await _messages(communicator)) == []
    await communicator.disconnect()


async def test_a_share_that_was_remote_here_and_ended_as_a_local_share_elsewhere_stays_revoked_here(
        node, token, remote):
    """Its `sharing` says how it was placed last (local, elsewhere): its first pod's token for this
    node must still be refused once it has ended, not come back to life until it expires."""
    vision = remote["vision"]
    elsewhere = await sync_to_async(Gpu.objects.exclude(node=node).first)()
    await sync_to_async(_requeue_and_place)(vision.pk, elsewhere, preempted=True)
    await sync_to_async(Reservation.objects.filter(pk=vision.pk).update)(sharing=Sharing.LOCAL)
    await sync_to_async(services.release)(vision.pk, State.SUCCEEDED, "done", SYSTEM)
    now = await sync_to_async(revoked_shares_for_node)(node.pk)
    assert [(s.share, s.from_attempt) for s in now.shares] == [(str(vision.pk), vision.attempt + 2)]
