"""Remote GPU shares on Kubernetes, end to end: a real agent on a node without a GPU
(`tessera-agent --no-gpus`) says hello to a real portal with the node's CPU and memory, learns from
the welcome which GPU nodes' servers to probe (at the InternalIP the cluster reports for them),
measures the link to a real remote server, and the placement cycle then runs a remote share's pod
on that CPU-only node through the kubernetes backend (the fake API server, PodSecurity baseline):
no share slot, the client libraries from an init container, the server's address and a token."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from decimal import Decimal

import pytest

from scheduler.backends.base import REMOTE_CLIENT_DIR, REMOTE_SERVER_PORT
from scheduler.backends.kubernetes.manifests import SHARE_RESOURCE
from tests.scheduler.backends.conftest import load_fake_apiserver
from tests.scheduler.backends.portal_on_fake_cluster import point_portal_at
from tests.teams import make_team
from tests.waiting import wait_for
from wire import share_tokens as tokens
from wire.inventory import load_inventory

from .conftest import INVENTORY, ROOT, Portal

pytestmark = pytest.mark.timeout(180)
NAMESPACE = "tessera-workloads"
SERVER_IP = "127.0.0.44"  # t4-node-1's InternalIP: the loopback network is all of 127/8
CPU_NODE_IP = "127.0.0.45"
SECRET = b"t4-node-1 secret, 32 bytes long.."


@pytest.fixture
def apiserver():
    server = load_fake_apiserver().FakeApiServer(namespaces=("default", "tessera")).start()
    server.add_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "baseline"})
    yield server
    server.stop()
    assert not server.invalid, f"the backend sent invalid manifests: {server.invalid}"


@pytest.fixture
def remote_server(tmp_path):
    """The GPU node's remote-share server on its InternalIP:7470, as the node DaemonSet runs it."""
    subprocess.run(["make", "-s", "-C", str(ROOT / "preload"), "all"], check=True, capture_output=True)
    with socket.socket() as s:
        try:
            s.bind((SERVER_IP, REMOTE_SERVER_PORT))
        except OSError as exc:
            pytest.skip(f"{SERVER_IP}:{REMOTE_SERVER_PORT} is not free here: {exc}")
    secret = tmp_path / "secrets" / "t4-node-1"
    secret.parent.mkdir()
    secret.write_bytes(SECRET + b"\n")
    build = ROOT / "preload" / "build"
    log = (tmp_path / "server.log").open("ab")
    proc = subprocess.Popen(
        [str(build / "remote/tessera-remote-server"), "--listen", f"{SERVER_IP}:{REMOTE_SERVER_PORT}",
         "--secret-file", str(secret), "--worker", str(build / "remote/tessera-remote-worker"),
         "--preload", str(build / "libtessera_preload.so"), "--budget-dir", str(tmp_path),
         *[arg for gpu in _node_gpus("t4-node-1") for arg in ("--gpu", gpu)]], stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: _listens(SERVER_IP, REMOTE_SERVER_PORT), 20, "the remote server to listen")
    yield secret.parent
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


def _node_gpus(name: str) -> list[str]:
    [node] = [n for n in load_inventory(INVENTORY) if n.name == name]
    return [g.uuid for g in node.gpus]


def _listens(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def test_a_cpu_only_nodes_agent_makes_room_for_a_remote_share_whose_pod_runs_there_on_kubernetes(
        transactional_db, apiserver, remote_server, settings, tmp_path, monkeypatch,
        django_capture_on_commit_callbacks):
    from portal.celery import app as celery_app
    from portal.fleet import inventory
    from portal.fleet.models import Node, NodeLink
    from portal.fleet.services import issue_node_token
    from portal.placement import backend as backend_module
    from portal.placement import tasks
    from portal.reservations import rules, services
    from portal.reservations.models import Reservation
    from portal.tenancy.models import Membership, Role, TeamPolicy

    # The portal as deploy/portal configures it, in this process (the cycle) and in Daphne (the agents).
    point_portal_at(apiserver, settings, tmp_path, monkeypatch)
    monkeypatch.setattr(celery_app.conf, "task_always_eager", True)
    for name, value in (("TESSERA_BACKEND", "kubernetes"), ("TESSERA_NAMESPACE", NAMESPACE),
                        ("TESSERA_REMOTE_SECRETS_DIR", str(remote_server)), ("TESSERA_POD_CPU_MILLI", "1000")):
        monkeypatch.setenv(name, value)
        setattr(settings, name, int(value) if value.isdigit() else value)
    backend_module.forget_backends()
    inventory.load(INVENTORY)
    # The cluster: every GPU node with its InternalIP (only t4-node-1's has a server), and a CPU-only node.
    for i, node in enumerate(load_inventory(INVENTORY)):
        apiserver.add_node(node.name, address=SERVER_IP if node.name == "t4-node-1" else f"127.0.0.{50 + i}")
    apiserver.add_node("cpu-node-1", address=CPU_NODE_IP)
    Node.objects.exclude(gpus=None).update(cpu_milli=500, memory_mib=65536)  # no room for a 1-CPU pod
    cpu_node = Node.objects.create(name="cpu-node-1")  # manage.py node_token cpu-node-1 --create
    token = issue_node_token(cpu_node)
    team = make_team("vision", "Vision", namespace="team-vision", quota_gpu_share=Decimal(4),
                               quota_memory_mib=400_000, quota_max_gpus=4)
    TeamPolicy.objects.create(team=team, allow_remote=True)
    from django.contrib.auth import get_user_model

    alice = get_user_model().objects.create_user("alice", password="x")
    Membership.objects.create(user=alice, team=team, role=Role.MEMBER)

    def cycle():
        with django_capture_on_commit_callbacks(execute=True):
            tasks.run_cycles("test")

    tasks.reconcile()  # the nodes' addresses, as the cluster reports them (the watch does the same)
    assert Node.objects.get(name="t4-node-1").address == SERVER_IP

    portal = Portal(tmp_path)
    portal.start()
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    (proc_root / "meminfo").write_text("MemTotal:       65536000 kB\nMemFree:        1000 kB\n")
    log = (tmp_path / "agent.log").open("ab")
    agent = subprocess.Popen(
        [sys.executable, "-m", "agents", "--portal", portal.url, "--no-gpus", "--node", "cpu-node-1",
         "--proc-root", str(proc_root), "--reserved-cpu", "0", "--reserved-memory", "1000", "--interval", "0.5",
         "--probe-interval", "1", "--backoff-max", "2", "--log-level", "INFO"],
        cwd=ROOT, env={**os.environ, "TESSERA_AGENT_TOKEN": token}, stdout=log, stderr=subprocess.STDOUT)
    try:
        # Its hello: the node's CPU and memory (the host's, less what is reserved), within the protocol.
        wait_for(lambda: Node.objects.filter(pk=cpu_node.pk, memory_mib=64_000 - 1000).exists(), 30,
                 "the agent's hello with the node's resources")
        assert Node.objects.get(pk=cpu_node.pk).cpu_milli == os.cpu_count() * 1000
        # The welcome named the GPU nodes at their InternalIPs; the one with a server answered the probe.
        link = wait_for(lambda: NodeLink.objects.filter(client=cpu_node, gpu_node__name="t4-node-1").first(), 60,
                        "the measured link to t4-node-1's server")
        assert link.bandwidth_mbps > 0 and link.rtt_ms > 0
        assert set(NodeLink.objects.filter(client=cpu_node).values_list("gpu_node__name", flat=True)) == {"t4-node-1"}
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(15)
        portal.stop()
    agent_log = (tmp_path / "agent.log").read_text()
    assert "0 GPUs (none)" in agent_log, agent_log

    r = services.submit(alice, rules.ReservationSpec(team=team, image="ghcr.io/example/train:1",
                                                     gpu_request=Decimal("0.25"), gpu_memory_mib=2048,
                                                     gpu_model="T4", priority=40, remote_allowed=True))
    cycle()
    r = Reservation.objects.select_related("node", "client_node").get(pk=r.pk)
    assert (r.sharing, r.client_node.name, r.node.name) == ("remote", "cpu-node-1", "t4-node-1"), r.state_reason
    pod = apiserver.pod(NAMESPACE, r.pod_name)  # admitted under PodSecurity baseline, validated
    spec = pod["spec"]
    assert spec["nodeName"] == "cpu-node-1"
    (container,) = spec["containers"]
    assert SHARE_RESOURCE not in str(container.get("resources", {})) and "runtimeClassName" not in spec
    assert [c["name"] for c in spec["initContainers"]] == ["tessera-remote-client"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TESSERA_REMOTE_SERVER"] == f"{SERVER_IP}:{REMOTE_SERVER_PORT}"  # the address, not the name
    assert env["LD_LIBRARY_PATH"] == REMOTE_CLIENT_DIR
    terms, _ = tokens.verify(SECRET, env["TESSERA_REMOTE_TOKEN"])
    assert (terms.share, terms.memory_bytes, terms.request) == (str(r.pk), 2048 << 20, 0.25)

    # The CPU-only node goes NotReady (its pod dies there, though its GPU is well): the share is
    # requeued (the team's policy), as for a GPU node, and its GPU's share is free again.
    apiserver.set_node_ready("cpu-node-1", False)
    wait_for(lambda: (tasks.sync(0.3) or True) and Reservation.objects.get(pk=r.pk).state == "pending", 30,
             "the remote share requeued after its pod's node went NotReady")
    r.refresh_from_db()
    assert r.transitions.last().reason == "requeued: node cpu-node-1 is not ready"
    assert not r.allocations.filter(released_at__isnull=True).exists()
