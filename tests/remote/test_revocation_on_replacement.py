"""A remote share preempted, requeued and placed again on the same GPU node gets a new token, and its
old one stops working there at once: the portal's revoked list (portal/telemetry/services.py), as the
node's agent writes it (agents/remote/revocations.py), against the real remote server."""

from __future__ import annotations

import contextlib
import secrets
import socket
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from .conftest import GpuHost, closed_by_server, hello_bytes, read_reply

pytestmark = pytest.mark.django_db

DEMO_INVENTORY = Path(__file__).resolve().parents[2] / "deploy" / "inventory" / "demo.yaml"
NODE = "t4-node-1"


@pytest.fixture
def gpu_host(built, tmp_path: Path, settings) -> Iterator[GpuHost]:
    """The GPU node's remote server, reading the file its agent writes; the portal signs with the
    same node secret."""
    (tmp_path / "secrets").mkdir()
    host = GpuHost(tmp_path, secrets.token_hex(32).encode(),
                   server_args=("--revoked-file", str(tmp_path / "revoked-shares"))).start()
    (tmp_path / "secrets" / NODE).write_bytes(host.secret)
    settings.TESSERA_REMOTE_SECRETS_DIR = str(tmp_path / "secrets")
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def share():
    """A remote share of alice's on t4-node-1, whose GPU is the fake driver's."""
    from django.contrib.auth import get_user_model

    from portal.fleet import inventory
    from portal.fleet.models import Gpu
    from portal.reservations.models import Reservation, Sharing
    from portal.tenancy.models import Membership, Quota, Role, Team
    from tests.reservations import placed, submitted

    inventory.load(DEMO_INVENTORY)
    team = Team.objects.create(slug="vision", name="Vision")
    Quota.objects.create(team=team, gpu_model="*", gpu_share=Decimal("2.0"), gpu_memory_gib=200, gpus=4)
    alice = get_user_model().objects.create_user("alice")
    Membership.objects.create(user=alice, team=team, role=Role.MEMBER)
    gpu = Gpu.objects.filter(node__name=NODE).order_by("index").first()
    Gpu.objects.filter(pk=gpu.pk).update(uuid="GPU-fake-0")
    gpu.refresh_from_db()
    r = placed(submitted(alice, team, gpu_request=Decimal("0.25"), gpu_memory_mib=1024), gpu)
    Reservation.objects.filter(pk=r.pk).update(sharing=Sharing.REMOTE)
    return r, gpu


def _token(reservation_id: int, gpu) -> str:
    """The token the portal puts in the share's pod, for its current placement."""
    from portal.placement import share_tokens
    from portal.reservations.models import Reservation
    from scheduler.backends import GpuShare

    attempt = Reservation.objects.get(pk=reservation_id).attempt
    terms = GpuShare(uuid=gpu.uuid, index=gpu.index, gpu_request=0.25, gpu_limit=0.25, gpu_memory_mib=1024)
    return share_tokens.remote_env(str(reservation_id), attempt, NODE, None, terms, 50)["TESSERA_REMOTE_TOKEN"]


def _requeue_and_place_again(reservation_id: int, gpu) -> None:
    from django.db import transaction

    from portal.reservations import services
    from portal.reservations.states import HOLDS_GPU, State
    from tests.reservations import SYSTEM

    with transaction.atomic():
        assert services.move(reservation_id, HOLDS_GPU, State.PREEMPTED, "reclaimed", SYSTEM)
        assert services.move(reservation_id, State.PREEMPTED, State.PENDING, "requeued", SYSTEM)
        services.place(reservation_id, gpu.node_id, [services.NewAllocation(gpu.pk, Decimal("0.25"), 1024)])


def _agent_writes_what_the_portal_sends(path: Path) -> None:
    from agents.remote.revocations import RevokedFile
    from portal.fleet.models import Node
    from portal.telemetry.services import revoked_shares_for_node
    from wire.agent_portal import PORTAL_MESSAGES, encode, parse

    body = revoked_shares_for_node(Node.objects.get(name=NODE).pk)
    RevokedFile(path).write(parse(encode(body), PORTAL_MESSAGES))


@contextlib.contextmanager
def _hello(host: GpuHost, token: str) -> Iterator[tuple[socket.socket, int, bytes]]:
    with socket.create_connection(("127.0.0.1", host.port)) as s:
        s.sendall(hello_bytes(token))
        yield s, *read_reply(s)


def test_a_share_placed_again_on_the_same_node_is_served_only_with_its_new_token(gpu_host, share, tmp_path):
    from portal.reservations.models import Reservation, Sharing

    reservation, gpu = share
    revoked_file = tmp_path / "revoked-shares"
    first = _token(reservation.pk, gpu)
    _agent_writes_what_the_portal_sends(revoked_file)
    with _hello(gpu_host, first) as (old_pod, result, _message):
        assert result == 0  # the first placement's pod is served

        _requeue_and_place_again(reservation.pk, gpu)  # remote again (the cycle's choice)
        Reservation.objects.filter(pk=reservation.pk).update(sharing=Sharing.REMOTE)
        second = _token(reservation.pk, gpu)
        _agent_writes_what_the_portal_sends(revoked_file)

        assert closed_by_server(old_pod)  # the old pod's running worker is ended
    with _hello(gpu_host, first) as (_s, result, message):
        assert result != 0 and f"share {reservation.pk} was revoked".encode() in message
    with _hello(gpu_host, second) as (_s, result, _message):
        assert result == 0  # the new placement's pod is served
    # Released for good: neither token works any more.
    from portal.reservations import services
    from portal.reservations.states import State
    from tests.reservations import SYSTEM

    services.release(reservation.pk, State.CANCELLED, "by its owner", SYSTEM)
    _agent_writes_what_the_portal_sends(revoked_file)
    for token in (first, second):
        with _hello(gpu_host, token) as (_s, result, message):
            assert result != 0 and b"was revoked" in message
