"""A fake kubelet (the Registration service on kubelet.sock; on Register it dials the plugin back
and follows ListAndWatch, as the kubelet does), the fake API server of the backend tests, and a
running device plugin wired to both."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agents.deviceplugin import api_pb2, api_pb2_grpc
from agents.deviceplugin.pods import KubernetesPods, PodFinder
from agents.deviceplugin.server import DevicePluginService, PluginConfig, PluginRunner
from agents.gpus.base import GpuDevice

FAKE_APISERVER = Path(__file__).resolve().parents[2] / "scheduler" / "backends" / "fake_apiserver.py"
NODE = "gpu-node-1"
GPUS = [GpuDevice(index=i, uuid=f"GPU-00000000-0000-4000-8000-00000000000{i}", model="A100",
                  memory_mib=40960, numa_node=i // 2, nvlink_peers=(), mig_mode="disabled") for i in range(2)]


def load_fake_apiserver():
    name = "tessera_tests_fake_apiserver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKE_APISERVER)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.devices: dict[str, str] = {}  # device ID -> health, from the latest ListAndWatch answer
        self.updates = 0
        self.cond = threading.Condition()
        self._channels: list[grpc.Channel] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
        self.server.start()

    def Register(self, request, context):
        with self.cond:
            self.registrations.append(request)
            self.cond.notify_all()
        threading.Thread(target=self._follow, args=(request.endpoint,), daemon=True).start()
        return api_pb2.Empty()

    def plugin(self, endpoint: str) -> api_pb2_grpc.DevicePluginStub:
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        self._channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel)

    def _follow(self, endpoint: str) -> None:
        try:
            for answer in self.plugin(endpoint).ListAndWatch(api_pb2.Empty()):
                with self.cond:
                    self.devices = {d.ID: d.health for d in answer.devices}
                    self.updates += 1
                    self.cond.notify_all()
        except grpc.RpcError:
            pass  # the plugin went away

    def wait_for(self, predicate, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                assert left > 0, "timed out waiting for the plugin"
                self.cond.wait(left)

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        self.server.stop(grace=0).wait()


@pytest.fixture
def plugin_dir():
    # Unix socket paths must stay under 108 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir):
    k = FakeKubelet(plugin_dir)
    yield k
    k.stop()


@pytest.fixture
def apiserver():
    server = load_fake_apiserver().FakeApiServer(namespaces=("default", "team-vision")).start()
    server.add_node(NODE)
    yield server
    server.stop()


@pytest.fixture
def plugin(plugin_dir, kubelet, apiserver):
    cfg = PluginConfig(node=NODE, gpus=GPUS, plugin_dir=str(plugin_dir), slots_per_gpu=4)
    # The admission budget (20 s) shortened: a test of an API server that stays away waits it out.
    pods = KubernetesPods(host=apiserver.url, budget_s=3.0)
    service = DevicePluginService(cfg, PodFinder(pods, NODE, cfg.resource_name))
    runner = PluginRunner(service, check_every_s=0.1)
    runner.start()
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    yield runner
    runner.stop()
    thread.join(5)
