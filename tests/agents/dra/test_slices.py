"""The node's GPUs published as a ResourceSlice: what a scheduler reads from it, generations on
change, nothing written while nothing changes, gone with the node."""

from __future__ import annotations

import threading

from agents.dra.slices import MIB, SliceApi, SlicePublisher, semver, slice_name

NODE = "gpu-node-1"


def _publisher(apiserver) -> SlicePublisher:
    return SlicePublisher(SliceApi(host=apiserver.url), NODE)


def test_each_gpu_is_a_shareable_device_with_its_attributes_and_capacity(apiserver, gpus):
    stored = _publisher(apiserver).sync(gpus, "535.104.05", "12.2")
    spec = stored["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        "gpu.tessera.io", NODE, {"name": NODE, "generation": 1, "resourceSliceCount": 1})
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    gpu1 = spec["devices"][1]
    assert gpu1["allowMultipleAllocations"] is True
    assert gpu1["attributes"] == {
        "index": {"int": 1}, "uuid": {"string": gpus[1].uuid}, "model": {"string": "NVIDIA-A100-SXM4-40GB"},
        "productName": {"string": "NVIDIA A100-SXM4-40GB"}, "memoryMiB": {"int": 40960}, "numaNode": {"int": 0},
        "nvlinkPeers": {"string": "gpu-0,gpu-2,gpu-3"}, "driverVersion": {"string": "535.104.05"},
        "cudaDriverVersion": {"version": "12.2.0"}}
    assert gpu1["capacity"]["compute"] == {"value": "1000", "requestPolicy": {
        "default": "1000", "validRange": {"min": "10", "max": "1000", "step": "10"}}}
    memory = str(40960 * MIB)
    assert gpu1["capacity"]["memory"] == {"value": memory, "requestPolicy": {
        "default": memory, "validRange": {"min": str(MIB), "max": memory, "step": str(MIB)}}}
    node_uid = apiserver.objects("Node")[0]["metadata"]["uid"]
    assert stored["metadata"]["ownerReferences"][0]["uid"] == node_uid


def test_an_unchanged_node_writes_nothing_and_a_change_bumps_the_generation(apiserver, gpus):
    publisher = _publisher(apiserver)
    publisher.sync(gpus, "550.54.15", "12.4")
    publisher.sync(gpus, "550.54.15", "12.4")
    assert publisher.writes == 1
    stored = publisher.sync(gpus[:3], "550.54.15", "12.4")  # a GPU fell off the bus
    assert stored["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert publisher.sync(gpus, "550.54.15", "12.4")["spec"]["pool"]["generation"] == 3
    assert publisher.writes == 3


def test_a_slice_written_meanwhile_is_read_again_not_overwritten_blindly(apiserver, gpus):
    publisher = _publisher(apiserver)
    publisher.sync(gpus, "550.54.15", "12.4")
    # Another writer's change lands between our read and our write: the first replace gets 409.
    apiserver.inject("PUT", r"/resourceslices/", status=409)
    stored = publisher.sync(gpus[:2], "550.54.15", "12.4")
    assert stored["spec"]["pool"]["generation"] == 2
    assert len(apiserver.calls("PUT", r"/resourceslices/")) == 2


def test_a_slice_deleted_by_hand_comes_back_and_goes_with_the_node(apiserver, gpus):
    publisher = _publisher(apiserver)
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(lambda: (gpus, "550.54.15", "12.4"), stop, 0.05))
    thread.start()
    try:
        _wait(lambda: apiserver.objects("ResourceSlice"))
        publisher.withdraw()
        _wait(lambda: apiserver.objects("ResourceSlice"))
    finally:
        stop.set()
        thread.join(5)
    apiserver.remove_node(NODE)
    assert apiserver.objects("ResourceSlice") == []
    assert slice_name(NODE) == "gpu-node-1-gpu.tessera.io"


def test_driver_versions_become_semantic_versions():
    assert semver("535.104.05") == "535.104.5"
    assert semver("12.4") == "12.4.0"
    assert semver("unknown") is None


def _wait(predicate, timeout_s: float = 10.0) -> None:
    event = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return
        event.wait(0.02)
    raise AssertionError("timed out")


def test_a_slice_is_published_once_the_api_server_answers(apiserver, gpus):
    apiserver.go_down()
    publisher = _publisher(apiserver)
    publisher.api.timeout_s = 0.5
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(lambda: (gpus, "550.54.15", "12.4"), stop, 0.05))
    thread.start()
    try:
        apiserver.come_back(authorizing_s=0.0)
        _wait(lambda: apiserver.objects("ResourceSlice"))
    finally:
        stop.set()
        thread.join(5)
