"""A fake API server per test and a `KubernetesBackend` pointed at it with short retries."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from scheduler.backends import GpuShare, make_pod_spec


def load_fake_apiserver():
    """The fake API server module, by file (the tests are not a package; the device plugin tests
    load the same module this way)."""
    return _load("tessera_tests_fake_apiserver", "fake_apiserver.py")


def load_real_apiserver():
    return _load("tessera_tests_real_apiserver", "real_apiserver.py")


def _load(name: str, filename: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def apiserver():
    """The fake API server; with TESSERA_TEST_KUBE_API set, a real one behind the fake's surface
    (real_apiserver.py says what it needs)."""
    if os.environ.get("TESSERA_TEST_KUBE_API"):
        server = load_real_apiserver().RealApiServer(
            os.environ["TESSERA_TEST_KUBE_API"], os.environ["TESSERA_TEST_KUBE_TOKEN"],
            os.environ["TESSERA_TEST_KUBE_AUDIT_LOG"], load_fake_apiserver().Request).start()
    else:
        server = load_fake_apiserver().FakeApiServer(namespaces=("default", "tessera", "team-vision")).start()
    yield server
    server.stop()
    assert not server.invalid, f"the backend sent invalid manifests: {server.invalid}"


@pytest.fixture
def make_backend(apiserver):
    from scheduler.backends.kubernetes import KubernetesBackend

    made = []

    def make(**overrides):
        options = dict(host=apiserver.url, watch_timeout_s=5,
                       retry=dict(attempts=4, base_s=0.01, max_s=0.05, connect_timeout_s=1.0, read_timeout_s=1.0))
        options.update(overrides)
        backend = KubernetesBackend(**options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend):
    return make_backend()


def spec_for(reservation_id="42", attempt=1, node="gpu-node-1", namespace="tessera", team="vision",
             kind="batch", gpus=None, priority=10, command=("python", "train.py")):
    gpus = gpus or (GpuShare(uuid="GPU-0a1b2c3d-0000-4000-8000-000000000001", index=0, gpu_request=0.25,
                             gpu_limit=0.5, gpu_memory_mib=8192),)
    return make_pod_spec(reservation_id=reservation_id, attempt=attempt, namespace=namespace, node=node,
                         team=team, image="ghcr.io/example/train:1.0", command=command, gpus=gpus,
                         priority=priority, kind=kind, extra_env={"EPOCHS": "3"})


@pytest.fixture
def pod_spec():
    return spec_for


@pytest.fixture
def nodes(apiserver):
    for name in ("gpu-node-1", "gpu-node-2"):
        apiserver.add_node(name)
    return apiserver
