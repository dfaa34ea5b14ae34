"""The fake API server's `resource.k8s.io/v1` (DRA) refuses what the real one refuses, through the
official client: request policies, allowMultipleAllocations, generations, reservedFor, conflicts,
and (the fake's guard) allocations that over-commit a device."""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agents.dra.slices import MIB, resource_slice, slice_devices
from agents.gpus.base import GpuDevice

NODE = "gpu-node-1"
GPUS = [GpuDevice(index=i, uuid=f"GPU-00000000-0000-4000-8000-00000000000{i}", model="NVIDIA A100-SXM4-40GB",
                  memory_mib=40960, numa_node=0, nvlink_peers=(), mig_mode="disabled") for i in range(2)]


@pytest.fixture
def api(apiserver):
    apiserver.add_node(NODE)
    configuration = client.Configuration()
    configuration.host = apiserver.url
    configuration.retries = False
    api_client = client.ApiClient(configuration)
    yield client.ResourceV1Api(api_client)
    api_client.close()


def _body(resp) -> dict:
    return json.loads(resp.data)


def _slice(apiserver, **changes) -> dict:
    node = apiserver.objects("Node")[0]
    body = resource_slice(NODE, node["metadata"]["uid"], slice_devices(GPUS, "550.54.15", "12.4"), generation=1)
    for path, value in changes.items():
        target = body
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = value
    return body


def _refused(apiserver, call, status=422) -> str:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == status, info.value.body
    apiserver.invalid.clear()  # refused on purpose
    return json.loads(info.value.body)["message"]


def _claim(name: str, compute: str | None = "400", memory: str | None = "12Gi", count: int = 1,
           device_class: str = "gpu-share.tessera.io") -> dict:
    exactly: dict = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    requests = {k: v for k, v in (("compute", compute), ("memory", memory)) if v is not None}
    if requests:
        exactly["capacity"] = {"requests": requests}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team-vision"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def _allocation(device: str, compute: str, memory: str) -> dict:
    return {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": device,
        "shareID": "6f1c2a40-0000-4000-8000-000000000001",
        "consumedCapacity": {"compute": compute, "memory": memory}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}


def _allocate(api, name: str, allocation: dict, reserved: list[dict] | None = None) -> dict:
    claim = _body(api.read_namespaced_resource_claim(name, "team-vision", _preload_content=False))
    claim["status"] = {"allocation": allocation, "reservedFor": reserved or []}
    return _body(api.replace_namespaced_resource_claim_status(name, "team-vision", claim, _preload_content=False))


def test_a_published_slice_is_listed_by_node_and_driver(apiserver, api):
    api.create_resource_slice(_slice(apiserver), _preload_content=False)
    listed = _body(api.list_resource_slice(field_selector=f"spec.nodeName={NODE},spec.driver=gpu.tessera.io",
                                           _preload_content=False))
    assert [s["metadata"]["name"] for s in listed["items"]] == [f"{NODE}-gpu.tessera.io"]
    device = listed["items"][0]["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["compute"]["requestPolicy"]["validRange"] == {"min": "10", "max": "1000", "step": "10"}
    other = _body(api.list_resource_slice(field_selector="spec.nodeName=gpu-node-9", _preload_content=False))
    assert other["items"] == []


def test_a_request_policy_needs_allow_multiple_allocations(apiserver, api):
    body = _slice(apiserver)
    del body["spec"]["devices"][0]["allowMultipleAllocations"]
    message = _refused(apiserver, lambda: api.create_resource_slice(body, _preload_content=False))
    assert _says(apiserver, "allowMultipleAllocations must be true", message)


@pytest.mark.parametrize(("policy", "words"), [
    ({"default": "5", "validRange": {"min": "10", "max": "1000", "step": "10"}}, "default value is not valid"),
    ({"default": "1000", "validRange": {"min": "10", "max": "2000", "step": "10"}}, "must be within min and capacity"),
    ({"default": "500", "validRange": {"min": "10", "max": "995", "step": "10"}}, "must be a multiple of step"),
    ({"validRange": {"min": "10"}}, "default: Required value"),
    ({"default": "500", "validValues": ["1000", "500"]}, "ascending"),
    ({"default": "250", "validValues": ["500", "1000"]}, "default value is not valid"),
    ({"default": "500", "validValues": ["500"], "validRange": {"min": "10"}}, "more than one"),
])
def test_a_request_policy_off_its_own_rules_is_refused(apiserver, api, policy, words):
    body = _slice(apiserver)
    body["spec"]["devices"][0]["capacity"]["compute"]["requestPolicy"] = policy
    assert _says(apiserver, words, _refused(apiserver, lambda: api.create_resource_slice(body, _preload_content=False)))


def test_pool_fields_and_attributes_are_checked(apiserver, api):
    def create(body):
        return api.create_resource_slice(body, _preload_content=False)

    body = _slice(apiserver)
    body["spec"]["pool"]["resourceSliceCount"] = 0
    assert _says(apiserver, "greater than zero", _refused(apiserver, lambda: create(body)))
    body = _slice(apiserver)
    body["spec"]["devices"][0]["attributes"]["uuid"] = {"string": "x" * 65}
    assert _says(apiserver, "Too long", _refused(apiserver, lambda: create(body)))
    body = _slice(apiserver)
    body["spec"]["devices"][1]["name"] = body["spec"]["devices"][0]["name"]
    assert _says(apiserver, "Duplicate", _refused(apiserver, lambda: create(body)))


def test_replacing_a_slice_needs_its_current_resource_version(apiserver, api):
    made = _body(api.create_resource_slice(_slice(apiserver), _preload_content=False))
    newer = copy.deepcopy(made)
    newer["spec"]["pool"]["generation"] = 2
    stored = _body(api.replace_resource_slice(made["metadata"]["name"], newer, _preload_content=False))
    assert stored["spec"]["pool"]["generation"] == 2
    assert stored["metadata"]["generation"] == 2  # the spec changed
    stale = copy.deepcopy(made)  # still at the first resourceVersion
    stale["spec"]["pool"]["generation"] = 3
    _refused(apiserver, lambda: api.replace_resource_slice(made["metadata"]["name"], stale, _preload_content=False),
             status=409)
    moved = copy.deepcopy(stored)
    moved["spec"]["nodeName"] = "gpu-node-2"
    assert _says(apiserver, "immutable", _refused(apiserver, lambda: api.replace_resource_slice(
        made["metadata"]["name"], moved, _preload_content=False)))


def test_a_slice_goes_with_its_node(apiserver, api):
    api.create_resource_slice(_slice(apiserver), _preload_content=False)
    apiserver.remove_node(NODE)
    assert apiserver.objects("ResourceSlice") == []


def test_claim_allocation_within_the_policy_is_stored_and_the_spec_stays(apiserver, api):
    api.create_resource_slice(_slice(apiserver), _preload_content=False)
    api.create_namespaced_resource_claim("team-vision", _claim("share"), _preload_content=False)
    pod = {"resource": "pods", "name": "train-0", "uid": "0b9d5a1e-0000-4000-8000-000000000001"}
    stored = _allocate(api, "share", _allocation("gpu-0", "400", str(12 * 1024 * MIB)), [pod])
    assert stored["status"]["reservedFor"] == [pod]
    assert stored["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["compute"] == "400"
    changed = copy.deepcopy(stored)
    changed["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    assert _says(apiserver, "immutable", _refused(apiserver, lambda: api.replace_namespaced_resource_claim(
        "share", "team-vision", changed, _preload_content=False)))
    moved = copy.deepcopy(stored)
    moved["status"]["allocation"] = _allocation("gpu-1", "400", str(12 * 1024 * MIB))
    assert _says(apiserver, "immutable", _refused(apiserver, lambda: api.replace_namespaced_resource_claim_status(
        "share", "team-vision", moved, _preload_content=False)))


def test_consumed_capacity_off_the_grid_or_beyond_the_device_is_refused(apiserver, api):
    assert apiserver.check_allocations  # the fake's guard: a real server leaves this to the allocator
    api.create_resource_slice(_slice(apiserver), _preload_content=False)
    for name in ("a", "b", "c"):
        api.create_namespaced_resource_claim("team-vision", _claim(name), _preload_content=False)
    message = _refused(apiserver, lambda: _allocate(api, "a", _allocation("gpu-0", "405", str(MIB))))
    assert _says(apiserver, "not min 10 plus a multiple of step", message)
    _allocate(api, "a", _allocation("gpu-0", "600", str(20 * 1024 * MIB)))
    message = _refused(apiserver, lambda: _allocate(api, "b", _allocation("gpu-0", "500", str(MIB))))
    assert _says(apiserver, "1100 consumed in all, the device has 1000", message)
    message = _refused(apiserver, lambda: _allocate(api, "c", _allocation("gpu-0", "400", str(21 * 1024 * MIB))))
    assert _says(apiserver, "memory of gpu.tessera.io/gpu-node-1/gpu-0", message)
    _allocate(api, "b", _allocation("gpu-0", "400", str(20 * 1024 * MIB)))  # exactly the rest fits


def test_reserved_for_holds_at_most_256_consumers_of_an_allocated_claim(apiserver, api):
    api.create_resource_slice(_slice(apiserver), _preload_content=False)
    api.create_namespaced_resource_claim("team-vision", _claim("gang", compute="10", memory="1Mi"),
                                         _preload_content=False)
    pods = [{"resource": "pods", "name": f"w-{i}", "uid": f"0b9d5a1e-0000-4000-8000-{i:012d}"} for i in range(257)]
    message = _refused(apiserver, lambda: _allocate(api, "gang", _allocation("gpu-0", "10", str(MIB)), pods))
    assert _says(apiserver, "must have at most 256 items", message)
    claim = _body(api.read_namespaced_resource_claim("gang", "team-vision", _preload_content=False))
    claim["status"] = {"reservedFor": pods[:1]}
    assert _says(apiserver, "not allocated", _refused(apiserver, lambda: api.replace_namespaced_resource_claim_status(
        "gang", "team-vision", claim, _preload_content=False)))
    assert len(_allocate(api, "gang", _allocation("gpu-0", "10", str(MIB)), pods[:256])["status"]["reservedFor"]) == 256


def test_a_device_of_an_older_generation_cannot_be_allocated(apiserver, api):
    assert apiserver.check_allocations  # the fake's guard
    made = _body(api.create_resource_slice(_slice(apiserver), _preload_content=False))
    newer = copy.deepcopy(made)
    newer["spec"]["pool"]["generation"] = 2
    newer["spec"]["devices"] = newer["spec"]["devices"][:1]  # gpu-1 is gone
    api.replace_resource_slice(made["metadata"]["name"], newer, _preload_content=False)
    api.create_namespaced_resource_claim("team-vision", _claim("late"), _preload_content=False)
    message = _refused(apiserver, lambda: _allocate(api, "late", _allocation("gpu-1", "400", str(MIB))))
    assert _says(apiserver, "in no current ResourceSlice", message)


def _says(apiserver, words: str, message: str) -> bool:
    """The refusal's words: the fake's; a real server words its own (the refusal itself is what counts)."""
    return type(apiserver).__name__ == "RealApiServer" or words in message
