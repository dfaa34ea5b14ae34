"""The committed gRPC stubs are what the proto generates, and the command line runs a plugin that
registers with a kubelet and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agents.deviceplugin import generate

REPO = Path(__file__).resolve().parents[3]


def test_the_committed_stubs_match_the_proto():
    for name, text in generate.generate().items():
        assert (generate.HERE / name).read_text() == text, f"{name} is stale: python -m agents.deviceplugin.generate"


def test_the_services_have_the_kubelets_wire_names():
    from agents.deviceplugin import api_pb2

    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]


def test_the_command_line_registers_a_simulated_node_and_stops_on_sigterm(kubelet, apiserver, plugin_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agents.deviceplugin", "--node", "t4-node-1", "--simulate",
         str(REPO / "deploy" / "inventory" / "demo.yaml"), "--api-server", apiserver.url,
         "--plugin-dir", str(plugin_dir), "--slots-per-gpu", "2"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        kubelet.wait_for(lambda: kubelet.devices, timeout_s=60)
        assert kubelet.registrations[0].resource_name == "tessera.io/gpu-share"
        assert len(kubelet.devices) % 2 == 0 and kubelet.devices
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "registered tessera.io/gpu-share" in out


def test_the_command_line_refuses_a_node_that_the_inventory_lacks(plugin_dir):
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "agents.deviceplugin", "--node", "nowhere", "--simulate",
         str(REPO / "deploy" / "inventory" / "demo.yaml"), "--plugin-dir", str(plugin_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--simulate" in proc.stderr and "nowhere" in proc.stderr
    assert time.monotonic() - started < 60


def test_the_command_line_outside_a_cluster_without_api_server_says_so(plugin_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    proc = subprocess.run(
        [sys.executable, "-m", "agents.deviceplugin", "--node", "t4-node-1", "--simulate",
         str(REPO / "deploy" / "inventory" / "demo.yaml"), "--plugin-dir", str(plugin_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "pass --api-server" in proc.stderr
