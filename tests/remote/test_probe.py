"""Link probes (agents/remote/probe.py) against the remote server's listener: bounded, no token, over
loopback and from the client namespace over the veth link; the link table refreshes slowly."""

from __future__ import annotations

import json
import random
import socket
import struct
import subprocess
import sys
import time

import pytest

from agents.remote.probe import LinkQuality, LinkTable, ProbeError, probe

from .conftest import REPO, GpuHost, Link, base_env


def test_a_probe_measures_round_trip_and_bandwidth(gpu_host: GpuHost) -> None:
    link = probe(gpu_host.address, gpu_node="gpu-1", pings=8, nbytes=2 << 20)
    assert link.gpu_node == "gpu-1"
    assert 0 < link.rtt_ms < 1000
    assert link.bandwidth_mbps > 10
    deadline = time.monotonic() + 10  # the server logs the probe once the prober has closed
    while "probe (8 pings, 2097152 bytes)" not in gpu_host.log and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "probe (8 pings, 2097152 bytes)" in gpu_host.log


def test_probes_are_bounded(gpu_host: GpuHost) -> None:
    with pytest.raises(ValueError, match="pings"):
        probe(gpu_host.address, pings=100)
    with pytest.raises(ValueError, match="bytes"):
        probe(gpu_host.address, nbytes=1 << 30)
    # a prober that asks the server for more than it gives is refused by the server itself
    with socket.create_connection(("127.0.0.1", gpu_host.port), timeout=10) as s:
        body = struct.pack("<IIIIQ", 0x31525354, 1, 4, 0, 1 << 30)
        s.sendall(struct.pack("<IIQ", 28, len(body), 0) + body)
        result, _, length, _, _ = struct.unpack("<iiIIQ", s.recv(24))
        assert result != 0
        assert b"at most 32 pings and 16777216 bytes" in s.recv(length)


def test_no_server_is_a_probe_error(built) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ProbeError, match="cannot probe"):
        probe(f"127.0.0.1:{port}", timeout_s=2)


def test_a_probe_over_the_veth_link(built, tmp_path, veth: Link) -> None:
    import secrets

    host = GpuHost(tmp_path, secrets.token_hex(32).encode(), host=veth.gpu_ip, netns=veth.gpu_ns).start()
    try:
        r = subprocess.run(["ip", "netns", "exec", veth.client_ns, sys.executable, "-m", "agents.remote.probe",
                            host.address, "--pings", "4", "--mib", "1"], cwd=REPO, env=base_env(),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["gpu_node"] == veth.gpu_ip
        assert out["rtt_ms"] > 0 and out["bandwidth_mbps"] > 10
    finally:
        host.stop()


def test_the_link_table_probes_one_node_at_a_time_and_slowly() -> None:
    now = [0.0]
    calls = []

    def prober(address: str, gpu_node: str) -> LinkQuality:
        calls.append(gpu_node)
        if gpu_node == "gpu-b":
            raise ProbeError("cannot probe 10.0.0.2:7470: refused")
        return LinkQuality(gpu_node, 0.2, 9000.0, 0.0)

    table = LinkTable({"gpu-a": "10.0.0.1:7470", "gpu-b": "10.0.0.2:7470"}, interval_s=600, prober=prober,
                      clock=lambda: now[0], rng=random.Random(1))
    now[0] = 61
    assert table.refresh() in {"gpu-a", "gpu-b"}
    assert table.refresh() in {"gpu-a", "gpu-b"}
    assert table.refresh() is None  # both probed; nothing is due for about ten minutes
    assert sorted(calls) == ["gpu-a", "gpu-b"]
    assert [link["gpu_node"] for link in table.report()] == ["gpu-a"]
    assert "refused" in table.errors["gpu-b"]
    now[0] = 61 + 500
    assert table.refresh() is None
    now[0] = 61 + 700
    assert table.refresh() is not None


def test_the_link_table_reports_to_the_portal_in_the_wire_links_message() -> None:
    from wire.agent_portal import AGENT_MESSAGES, Links, parse

    def prober(address: str, gpu_node: str) -> LinkQuality:
        if gpu_node == "gpu-b":
            raise ProbeError("cannot probe 10.0.0.2:7470: refused")
        return LinkQuality(gpu_node, 0.0004, 9400.5, 1_790_000_000.0)

    now = [1000.0]
    table = LinkTable({"gpu-a": "10.0.0.1:7470", "gpu-b": "10.0.0.2:7470"}, interval_s=600, prober=prober,
                      clock=lambda: now[0], rng=random.Random(1))
    now[0] += 61  # past the first probes' jitter (at most a tenth of the interval): both due now
    table.refresh()
    table.refresh()
    message = parse(table.message(), AGENT_MESSAGES)  # what the portal's consumer accepts
    assert isinstance(message, Links)
    [link] = message.links  # the node that did not answer is left out: the portal drops its link
    assert (link.gpu_node, link.bandwidth_mbps, link.ts_ms) == ("gpu-a", 9400.5, 1_790_000_000_000)
    assert link.rtt_ms == 0.001  # a loopback-fast round trip still counts as a positive one


def test_the_portals_servers_replace_its_earlier_ones_and_the_command_lines_stay() -> None:
    now = [0.0]
    probed: list[tuple[str, str]] = []

    def prober(address: str, gpu_node: str) -> LinkQuality:
        probed.append((gpu_node, address))
        return LinkQuality(gpu_node, 0.2, 9000.0, 0.0)

    table = LinkTable({"gpu-a": "10.0.0.1:7470"}, interval_s=600, prober=prober, clock=lambda: now[0],
                      rng=random.Random(1))
    # The portal names gpu-b and gpu-a at another address: the command line's gpu-a wins.
    assert table.offer({"gpu-a": "10.9.9.9:7470", "gpu-b": "10.0.0.2:7470"}) is False
    now[0] = 61
    while table.refresh() is not None:
        pass
    assert sorted(probed) == [("gpu-a", "10.0.0.1:7470"), ("gpu-b", "10.0.0.2:7470")]
    # A later session no longer names gpu-b (its node left): its link goes, and the caller resends.
    assert table.offer({"gpu-c": "10.0.0.3:7470"}) is True
    assert [link["gpu_node"] for link in table.report()] == ["gpu-a"]
    now[0] = 200
    assert table.refresh() == "gpu-c" and ("gpu-c", "10.0.0.3:7470") in probed
    assert [link["gpu_node"] for link in table.report()] == ["gpu-a", "gpu-c"]
