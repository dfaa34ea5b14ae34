"""A pod with an app (portal.connect): its port is declared and named for deploy/'s NetworkPolicy,
and the backend tells the portal's proxy where it listens, once the pod has an IP."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.backends import PodRef


def test_the_app_port_is_named_and_its_address_is_the_pods_ip(nodes, backend, pod_spec):
    if not hasattr(nodes, "store"):
        pytest.skip("sets the pod's IP in the fake API server's store")
    spec = pod_spec(kind="interactive")
    spec = replace(spec, env=tuple(sorted({**spec.env_dict(), "TESSERA_APP": "jupyter",
                                           "TESSERA_APP_PORT": "8888", "TESSERA_APP_TOKEN": "t" * 64}.items())))
    status = backend.bind(spec)
    (pod,) = nodes.pods()
    (container,) = pod["spec"]["containers"]
    assert container["ports"] == [{"name": "tessera-app", "containerPort": 8888, "protocol": "TCP"}]
    assert pod["metadata"]["labels"]["sharedgpu/app"] == "jupyter"
    ref = PodRef(status.namespace, status.name)
    assert backend.app_address(ref, 8888) is None  # no IP yet: the proxy answers "starting"
    with nodes.lock:
        nodes.store.objects[("Pod", ref.namespace, ref.name)]["status"]["podIP"] = "10.42.0.7"
    assert backend.app_address(ref, 8888) == "10.42.0.7:8888"
    assert backend.app_address(PodRef(ref.namespace, "gone"), 8888) is None
