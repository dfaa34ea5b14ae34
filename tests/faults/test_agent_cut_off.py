"""A node agent cut off from the portal: it runs in its own network namespace, whose link goes
down for TESSERA_FAULT_CUT_S seconds (default 300, the issue's five minutes). It keeps sampling
into its buffer; when the link comes back it reconnects and replays, and within the stated time
the portal holds every sample of the cut, with no hole in the sequence."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import UTC, datetime

import pytest

from portal.fleet.models import Node
from portal.fleet.services import issue_node_token
from portal.telemetry.models import GpuSample
from tests.waiting import wait_for

from .conftest import sample_holes, start_agent, start_portal

CUT_S = float(os.environ.get("TESSERA_FAULT_CUT_S", "300"))
CATCH_UP_S = 90  # reconnect (agent backoff at most 2 s, its ping timeout 20 s) and the replay
pytestmark = [pytest.mark.timeout(int(CUT_S) + 300)]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def namespace():
    """A network namespace joined to this one by a veth pair; (name, host address, host link)."""
    pid = os.getpid()
    name, host_link, ns_link = f"tsr{pid}", f"th{pid % 100000}", f"tn{pid % 100000}"
    net = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"this suite needs to create network namespaces (root, iproute2): {exc}")
    try:
        _ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link)
        _ip("link", "set", ns_link, "netns", name)
        _ip("addr", "add", f"{net}.1/30", "dev", host_link)
        _ip("link", "set", host_link, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{net}.2/30", "dev", ns_link)
        _ip("netns", "exec", name, "ip", "link", "set", ns_link, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name, f"{net}.1", host_link
    finally:
        subprocess.run(["ip", "link", "del", host_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_agent_cut_off_replays_its_buffer_without_a_hole(stage, namespace):
    name, host_address, host_link = namespace
    _, base = start_portal(stage, host="0.0.0.0")  # all addresses: reachable from the namespace
    port = int(base.rsplit(":", 1)[1])
    node = Node.objects.get(name="a100-node-1")
    start_agent(stage, f"http://{host_address}:{port}", node.name, issue_node_token(node), interval=1.0,
                prefix=("ip", "netns", "exec", name))
    wait_for(lambda: GpuSample.objects.filter(gpu__node=node).exists(), 60, "the agent's first samples")

    _ip("link", "set", host_link, "down")
    cut_at = datetime.now(UTC)
    time.sleep(CUT_S)
    _ip("link", "set", host_link, "up")
    back_at = datetime.now(UTC)
    started = time.monotonic()
    wait_for(lambda: GpuSample.objects.filter(gpu__node=node, ts__gt=back_at).exists(), CATCH_UP_S,
             "samples taken after the link came back")
    caught_up = time.monotonic() - started

    assert sample_holes(node.name) == []
    during = GpuSample.objects.filter(gpu__node=node, ts__gt=cut_at, ts__lt=back_at)
    seconds_covered = during.values("seq").distinct().count()
    # One sample a second, all of the cut (a second or two either side for the clocks).
    assert seconds_covered >= CUT_S - 3, f"{seconds_covered} samples for a {CUT_S:g} s cut"
    print(f"cut {CUT_S:g} s; {seconds_covered} samples of the cut stored; caught up {caught_up:.1f} s after")
