"""The fake API server of the backend tests (taught resource.k8s.io/v1) with a GPU node."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agents.gpus.base import GpuDevice

FAKE_APISERVER = Path(__file__).resolve().parents[2] / "scheduler" / "backends" / "fake_apiserver.py"
NODE = "gpu-node-1"
UUIDS = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(4)]
GPUS = [GpuDevice(index=i, uuid=UUIDS[i], model="NVIDIA A100-SXM4-40GB", memory_mib=40960, numa_node=i // 2,
                  nvlink_peers=tuple(u for u in UUIDS if u != UUIDS[i]), mig_mode="disabled") for i in range(4)]


def load_fake_apiserver():
    name = "tessera_tests_fake_apiserver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKE_APISERVER)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def apiserver():
    server = load_fake_apiserver().FakeApiServer(namespaces=("default", "team-vision")).start()
    server.add_node(NODE)
    yield server
    server.stop()
    assert not server.invalid, f"sent invalid objects: {server.invalid}"


@pytest.fixture
def gpus() -> list[GpuDevice]:
    return list(GPUS)
