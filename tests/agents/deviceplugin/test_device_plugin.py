"""The device plugin as the kubelet sees it: it registers, advertises GPU share slots and their
health, and answers Allocate with the env and mounts of the placement that the Kubernetes backend
wrote on the pod."""

from __future__ import annotations

import json
import os

import grpc
import pytest

from agents.deviceplugin import api_pb2
from agents.deviceplugin.devices import gpu_of
from agents.deviceplugin.pods import ALLOCATED_ANNOTATION, KubernetesPods
from scheduler.backends import GpuShare, PodRef, make_pod_spec
from scheduler.backends.base import PLACEMENT_ANNOTATION, external_binding, share_env
from scheduler.backends.kubernetes import KubernetesBackend

from .conftest import GPUS, NODE


def kubectl_pod(apiserver, name, *, shares=1, containers=1, namespace="team-vision"):
    """A pod as a kubectl user writes it: KubeShare labels, our scheduler, one share slot."""
    apiserver.create_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"sharedgpu/gpu_request": "0.5"}},
        "spec": {"schedulerName": "tessera", "containers": [
            {"name": f"c{i}", "image": "jupyter/base", "resources": {"limits": {"tessera.io/gpu-share": str(shares)}}}
            for i in range(containers)]}})


def place(apiserver, name, reservation, gpu=0, request=0.25, limit=0.5, memory_mib=8192, priority=60,
          namespace="team-vision"):
    """What the portal does for a kubectl pod: the backend labels it with the placement and binds it."""
    backend = KubernetesBackend(host=apiserver.url)
    try:
        labels, annotations = external_binding(reservation, "vision", (GpuShare(
            uuid=GPUS[gpu].uuid, index=gpu, gpu_request=request, gpu_limit=limit, gpu_memory_mib=memory_mib),),
            priority)
        backend.bind_external(PodRef(namespace, name), NODE, labels, annotations)
    finally:
        backend.close()


def allocate(kubelet, plugin, *device_ids):
    stub = kubelet.plugin(plugin.cfg.endpoint)
    request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(
        devices_ids=list(device_ids))])
    (answer,) = stub.Allocate(request, timeout=10).container_responses
    return answer


def test_the_plugin_registers_and_advertises_share_slots_of_each_gpu(plugin, kubelet):
    (reg,) = kubelet.registrations
    assert (reg.version, reg.resource_name, reg.endpoint) == ("v1beta1", "tessera.io/gpu-share", plugin.cfg.endpoint)
    kubelet.wait_for(lambda: kubelet.devices)
    assert len(kubelet.devices) == 2 * 4
    assert {gpu_of(d) for d in kubelet.devices} == {g.uuid for g in GPUS}
    assert set(kubelet.devices.values()) == {"Healthy"}
    options = kubelet.plugin(plugin.cfg.endpoint).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert not options.pre_start_required and not options.get_preferred_allocation_available


def test_a_gpu_that_turns_unhealthy_is_advertised_so_and_back(plugin, kubelet):
    kubelet.wait_for(lambda: kubelet.devices)
    plugin.service.set_unhealthy(frozenset({GPUS[1].uuid}))
    kubelet.wait_for(lambda: "Unhealthy" in kubelet.devices.values())
    assert {d for d, h in kubelet.devices.items() if h == "Unhealthy"} == {
        d for d in kubelet.devices if gpu_of(d) == GPUS[1].uuid}
    plugin.service.set_unhealthy(frozenset())
    kubelet.wait_for(lambda: set(kubelet.devices.values()) == {"Healthy"})


# The library where LD_PRELOAD names it, and in the container's /etc/ld.so.preload (which the container
# cannot unset like a variable); the broker's socket directory read-only (connect works through it,
# replacing the socket does not).
MOUNTS = {("/opt/tessera/lib", "/opt/tessera/lib", True),
          ("/opt/tessera/lib/ld.so.preload", "/etc/ld.so.preload", True),
          ("/run/tessera", "/run/tessera", True)}


def test_allocate_gives_the_container_its_gpu_share_preload_and_broker(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "notebook")
    place(apiserver, "notebook", "77", gpu=1, request=0.25, limit=0.5, memory_mib=8192, priority=60)
    answer = allocate(kubelet, plugin, f"{GPUS[0].uuid}::3")  # the kubelet's pick of slot does not matter
    assert dict(answer.envs) == {
        "NVIDIA_VISIBLE_DEVICES": GPUS[1].uuid,
        "LD_PRELOAD": "/opt/tessera/lib/libtessera_preload.so",
        "TESSERA_GPU_REQUEST": "0.25",
        "TESSERA_GPU_LIMIT": "0.5",
        "TESSERA_GPU_MEMORY_LIMIT": "8192Mi",
        "TESSERA_PRIORITY": "high",
        "TESSERA_SHARE_ID": "77",
        "TESSERA_BROKER_SOCKET": "/run/tessera/broker.sock",
    }
    mounts = {(m.host_path, m.container_path, m.read_only) for m in answer.mounts}
    assert mounts == MOUNTS
    assert list(answer.devices) == []  # the NVIDIA runtime adds the GPU from NVIDIA_VISIBLE_DEVICES
    assert apiserver.pod("team-vision", "notebook")["metadata"]["annotations"][ALLOCATED_ANNOTATION] == "1"


def test_a_pod_the_portal_creates_gets_the_same_share_from_allocate_as_its_reservation(plugin, kubelet, apiserver):
    apiserver.add_namespace("tessera-workloads", {"pod-security.kubernetes.io/enforce": "baseline"})
    gpus = (GpuShare(uuid=GPUS[1].uuid, index=1, gpu_request=0.3, gpu_limit=0.6, gpu_memory_mib=4096),)
    spec = make_pod_spec(reservation_id="31", attempt=1, namespace="tessera-workloads", node=NODE, team="vision",
                         image="ghcr.io/example/train:1", command=("python", "train.py"), gpus=gpus, priority=70,
                         kind="batch")
    backend = KubernetesBackend(host=apiserver.url)
    try:
        backend.bind(spec)  # PodSecurity baseline lets it in: no hostPath
    finally:
        backend.close()
    answer = allocate(kubelet, plugin, f"{GPUS[0].uuid}::0")
    assert dict(answer.envs) == share_env("31", gpus, 70)
    mounts = {(m.host_path, m.container_path, m.read_only) for m in answer.mounts}
    assert mounts == MOUNTS


def test_with_pass_device_specs_the_container_also_gets_its_gpus_device_nodes(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "notebook")
    place(apiserver, "notebook", "77", gpu=1)
    plugin.service.cfg.pass_device_specs = True  # read on every call
    answer = allocate(kubelet, plugin, "x")
    assert [(d.host_path, d.container_path, d.permissions) for d in answer.devices] == [
        ("/dev/nvidia1", "/dev/nvidia1", "rw"), ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"), ("/dev/nvidia-uvm-tools", "/dev/nvidia-uvm-tools", "rw")]


def test_claiming_reads_every_answer_so_the_next_request_on_the_connection_works(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "first")
    kubectl_pod(apiserver, "second")
    place(apiserver, "first", "1", gpu=0)
    place(apiserver, "second", "2", gpu=1)
    before = len(apiserver.calls("GET", r"^/api/v1/pods$"))
    allocate(kubelet, plugin, "x")
    allocate(kubelet, plugin, "x")
    # One list per Allocate: an unread PATCH answer would break the next list on the reused connection
    # (ResponseNotReady), and only a retry would hide it.
    assert len(apiserver.calls("GET", r"^/api/v1/pods$")) - before == 2


def test_two_placed_pods_each_get_their_own_placement_and_a_third_call_finds_none(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "first")
    kubectl_pod(apiserver, "second")
    place(apiserver, "first", "1", gpu=0)
    place(apiserver, "second", "2", gpu=1)
    got = {allocate(kubelet, plugin, "x").envs["TESSERA_SHARE_ID"] for _ in range(2)}
    assert got == {"1", "2"}
    with pytest.raises(grpc.RpcError) as refused:
        allocate(kubelet, plugin, "x")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod bound to gpu-node-1" in refused.value.details()


def test_each_container_of_a_pod_is_allocated_once(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "pair", containers=2)
    place(apiserver, "pair", "5")
    assert allocate(kubelet, plugin, "x").envs["TESSERA_SHARE_ID"] == "5"
    assert allocate(kubelet, plugin, "x").envs["TESSERA_SHARE_ID"] == "5"
    assert apiserver.pod("team-vision", "pair")["metadata"]["annotations"][ALLOCATED_ANNOTATION] == "2"
    with pytest.raises(grpc.RpcError):
        allocate(kubelet, plugin, "x")


def test_only_a_pod_asking_for_as_many_slots_as_the_kubelet_allocates_matches(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "two-slots", shares=2)
    place(apiserver, "two-slots", "9")
    with pytest.raises(grpc.RpcError):
        allocate(kubelet, plugin, "a")
    assert allocate(kubelet, plugin, "a", "b").envs["TESSERA_SHARE_ID"] == "9"


def test_a_pod_placed_on_another_nodes_gpu_is_refused_by_name(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "lost")
    backend = KubernetesBackend(host=apiserver.url)
    labels, annotations = external_binding("8", "vision", (GpuShare("GPU-ffffffff-0000-4000-8000-000000000009",
                                                                    0, 0.5, 0.5, 1024),), 10)
    backend.bind_external(PodRef("team-vision", "lost"), NODE, labels, annotations)
    backend.close()
    with pytest.raises(grpc.RpcError) as refused:
        allocate(kubelet, plugin, "x")
    assert "GPU-ffffffff-0000-4000-8000-000000000009" in refused.value.details()
    assert "which node gpu-node-1 does not have" in refused.value.details()


def test_a_broken_placement_annotation_is_refused_naming_the_field(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "broken")
    backend = KubernetesBackend(host=apiserver.url)
    broken = {"reservation": "3", "gpus": [GPUS[0].uuid], "request": 0.9, "limit": 0.4, "memory_mib": 10,
              "priority": "low"}
    backend.bind_external(PodRef("team-vision", "broken"), NODE, {}, {PLACEMENT_ANNOTATION: json.dumps(broken)})
    backend.close()
    with pytest.raises(grpc.RpcError) as refused:
        allocate(kubelet, plugin, "x")
    assert "limit 0.4 is below request 0.9" in refused.value.details()


def test_the_api_server_being_away_fails_the_allocation_with_the_reason(plugin, kubelet, apiserver):
    apiserver.inject("GET", r"^/api/v1/pods$", status=500, times=1000)
    with pytest.raises(grpc.RpcError) as refused:
        allocate(kubelet, plugin, "x")
    assert refused.value.details() == ("cannot list the pods of node gpu-node-1: "
                                       "HTTP 500 InternalError: injected fault (for 3 s)")


def test_a_final_refusal_fails_the_allocation_at_once_in_the_servers_words(plugin, kubelet, apiserver):
    apiserver.inject("GET", r"^/api/v1/pods$", status=401, times=1)
    with pytest.raises(grpc.RpcError) as refused:
        allocate(kubelet, plugin, "x")
    assert refused.value.details() == "cannot list the pods of node gpu-node-1: HTTP 401 Conflict: injected fault"


def test_an_api_server_restart_during_allocate_does_not_fail_the_pod(plugin, kubelet, apiserver):
    """Refused connections while it is down, then RBAC's 403 until its cache syncs: the allocation
    waits for it (within the admission budget)."""
    kubectl_pod(apiserver, "notebook")
    place(apiserver, "notebook", "77")
    restart = apiserver.restart(down_s=0.3, authorizing_s=0.6)
    try:
        assert allocate(kubelet, plugin, "x").envs["TESSERA_SHARE_ID"] == "77"
    finally:
        restart.join()
    assert apiserver.pod("team-vision", "notebook")["metadata"]["annotations"][ALLOCATED_ANNOTATION] == "1"


def test_the_allocation_counter_is_written_through_a_restart(apiserver):
    kubectl_pod(apiserver, "notebook")
    place(apiserver, "notebook", "77")
    rv = apiserver.pod("team-vision", "notebook")["metadata"]["resourceVersion"]
    restart = apiserver.restart(down_s=0.3, authorizing_s=0.6)
    try:
        assert KubernetesPods(host=apiserver.url, budget_s=3.0).annotate(
            "team-vision", "notebook", rv, {ALLOCATED_ANNOTATION: "1"})
    finally:
        restart.join()
    assert apiserver.pod("team-vision", "notebook")["metadata"]["annotations"][ALLOCATED_ANNOTATION] == "1"


def test_after_a_kubelet_restart_the_plugin_serves_and_registers_again(plugin, kubelet):
    kubelet.wait_for(lambda: kubelet.updates >= 1)
    os.unlink(plugin.socket_path)  # what the kubelet does to the directory when it starts
    kubelet.wait_for(lambda: len(kubelet.registrations) == 2)
    kubelet.wait_for(lambda: kubelet.updates >= 2)  # it dialled the new socket and got the devices


def test_a_short_api_server_hiccup_does_not_fail_the_allocation(plugin, kubelet, apiserver):
    kubectl_pod(apiserver, "notebook")
    place(apiserver, "notebook", "77")
    apiserver.inject("GET", r"^/api/v1/pods$", status=503, times=2)
    assert allocate(kubelet, plugin, "x").envs["TESSERA_SHARE_ID"] == "77"
    assert apiserver.faults_left() == 0


def test_a_gpu_that_nvml_stops_reporting_turns_unhealthy_until_it_is_back(plugin, kubelet):
    import threading

    from agents.deviceplugin.__main__ import watch_health
    from agents.gpus.base import GpuReading, Reading

    class FlakySource:  # stands in for NVML: the second GPU drops out, then returns
        kind = "nvml"
        visible = [g.uuid for g in GPUS]

        def devices(self):
            return list(GPUS)

        def read(self):
            return Reading(gpus=[GpuReading(u, 0, 0, 0, None, None) for u in self.visible])

    source = FlakySource()
    stop = threading.Event()
    thread = threading.Thread(target=watch_health, args=(source, plugin.service, 0.05, stop), daemon=True)
    thread.start()
    try:
        kubelet.wait_for(lambda: kubelet.devices)
        source.visible = [GPUS[0].uuid]
        kubelet.wait_for(lambda: {d for d, h in kubelet.devices.items() if h == "Unhealthy"} == {
            d for d in kubelet.devices if gpu_of(d) == GPUS[1].uuid})
        source.visible = [g.uuid for g in GPUS]
        kubelet.wait_for(lambda: set(kubelet.devices.values()) == {"Healthy"})
    finally:
        stop.set()
        thread.join(5)
