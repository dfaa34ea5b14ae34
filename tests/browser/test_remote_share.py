"""A remote share in a real browser: the reservation page says where the pod runs, which node's GPU
it uses and why (at desktop width and at 390 px), and the fleet view lists it as client node → GPU."""

import os
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from portal.fleet import inventory
from portal.fleet.models import Node, NodeLink
from portal.placement import backend as backend_module
from portal.placement import tasks
from portal.reservations import rules, services
from portal.tenancy.models import Membership, Role, TeamPolicy
from tests.teams import make_team

from .stack import shoot, sign_in

pytestmark = pytest.mark.browser


@pytest.fixture
def remote_share(chromium, transactional_db, settings, tmp_path):
    """A CPU-only node with room for the pod, GPU nodes without, a fast measured link: alice's request
    goes through the real placement cycle and binding (simulated cluster) and lands remote."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.TESSERA_BACKEND = "local"
    settings.TESSERA_LOCAL_STATE = str(tmp_path / "cluster.sqlite3")
    settings.TESSERA_POD_CPU_MILLI = 1000
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "t4-node-1").write_text("t4-node-1 secret, 32 bytes long..\n")
    settings.TESSERA_REMOTE_SECRETS_DIR = str(tmp_path / "secrets")
    backend_module.forget_backends()
    inventory.load(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "inventory", "demo.yaml"))
    backend_module.get_backend().add_nodes(["cpu-near"])
    Node.objects.exclude(gpus=None).update(cpu_milli=500, memory_mib=65536)
    cpu = Node.objects.create(name="cpu-near", cpu_milli=16000, memory_mib=65536)
    NodeLink.objects.create(client=cpu, gpu_node=Node.objects.get(name="t4-node-1"), rtt_ms=0.1,
                            bandwidth_mbps=25000, measured_at=timezone.now())
    team = make_team("vision", "Vision", quota_gpu_share=2, quota_memory_mib=100_000)
    TeamPolicy.objects.create(team=team, allow_remote=True)
    alice = get_user_model().objects.create_user("alice", password="s3cret-alice", is_staff=True)
    Membership.objects.create(user=alice, team=team, role=Role.MEMBER)
    r = services.submit(alice, rules.ReservationSpec(team=team, image="busybox:1.36", gpu_request=Decimal("0.25"),
                                                     gpu_memory_mib=4096, gpu_model="T4", remote_allowed=True))
    tasks.run_cycles("test")
    r.refresh_from_db()
    assert r.sharing == "remote", r.state_reason
    yield r.pk
    backend_module.forget_backends()


def test_the_reservation_page_and_fleet_view_show_a_remote_share(page, live_server, remote_share):
    base = live_server.url
    sign_in(page, base, "alice", "s3cret-alice")
    page.goto(f"{base}/reservations/{remote_share}/")
    sharing = page.locator("#sharing")
    assert sharing.inner_text().startswith("Remote share: no GPU node has room for the pod itself")
    stats = page.locator(".facts-grid").inner_text().lower()  # the labels are set in capitals by CSS
    assert "pod runs on\ncpu-near\nremote share" in stats and "gpu node\nt4-node-1" in stats
    shoot(page, "remote-share-reservation")
    page.set_viewport_size({"width": 390, "height": 900})
    assert sharing.is_visible()
    page.goto(f"{base}/fleet/?node=t4-node-1")
    remote = page.locator("ul.remote-shares")
    assert remote.inner_text().strip().startswith(f"#{remote_share} remote: cpu-near → GPU ")
    shoot(page, "remote-share-fleet")
