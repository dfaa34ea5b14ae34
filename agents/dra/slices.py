"""The node's GPUs as a DRA ResourceSlice (`resource.k8s.io/v1`) of driver `gpu.tessera.io`.

One slice per node, named `<node>-gpu.tessera.io`, one pool (the node's name), one device per GPU
(`gpu-<index>`) with `allowMultipleAllocations: true`, so that many claims can each consume part of a
GPU (KEP-5075, consumable capacity):

- `compute`: milli-GPUs (1000 = the whole GPU). Request policy: from 10 (0.01 of a GPU, the finest
  share the allocators can express in steps of 10; the portal's rules accept any share > 0 to three
  decimals, `portal/reservations/rules.py`) to 1000 in steps of 10; a request that names no compute
  takes the whole GPU (default 1000), so a claim of class `gpu-whole.tessera.io` needs no numbers.
- `memory`: bytes, from 1 MiB to the card's memory in steps of 1 MiB, default the whole card (a share
  without a memory cap could take it all; the example claims always name one).

Attributes (at most 64 characters each, as the API requires): `index`, `uuid`, `model` (the
label-safe name, spaces as dashes, as `sharedgpu/gpu_model` and `Gpu.model_label` write it),
`productName` (NVML's name), `memoryMiB`, `numaNode`, `nvlinkPeers` (the device names of its NVLink
peers, comma-separated), `driverVersion`, `cudaDriverVersion` (semver).

`SlicePublisher.sync` makes the stored slice match the GPUs: created when missing, replaced with
`pool.generation` + 1 when the devices changed (with a resourceVersion precondition; a conflict is
read again), untouched otherwise. The slice's ownerReference is the Node, so the garbage collector
deletes it when the node goes.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agents.gpus.base import GpuDevice
from agents.kube_client import kube_api_client

log = logging.getLogger(__name__)

DRIVER = "gpu.tessera.io"
API_VERSION = "resource.k8s.io/v1"
MIB = 1 << 20
COMPUTE = "compute"
MEMORY = "memory"
WHOLE_GPU_MILLI = 1000
# The finest share a claim can consume: 0.01 of a GPU. The portal's rules take any share > 0 with
# three decimals; on DRA a share is rounded up onto this grid by the allocator.
MIN_SHARE_MILLI = 10
SHARE_STEP_MILLI = 10
MAX_ATTRIBUTE_LENGTH = 64
_SEMVER = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def device_name(gpu: GpuDevice) -> str:
    return f"gpu-{gpu.index}"


def label_safe(model: str) -> str:
    """The label-safe name of an NVML model name (the rule of portal.fleet.model_names.label_name)."""
    return model.replace(" ", "-")


def semver(version: str | None) -> str | None:
    """A driver's "12.4" or "535.104.05" as the semantic version the API accepts ("12.4.0", "535.104.5")."""
    m = _SEMVER.match(version or "")
    return ".".join(str(int(part or 0)) for part in m.groups()) if m else None


def _text(value: str) -> dict[str, str]:
    return {"string": value[:MAX_ATTRIBUTE_LENGTH]}


def gpu_device(gpu: GpuDevice, peers: Sequence[GpuDevice], driver_version: str | None,
               cuda_version: str | None) -> dict[str, Any]:
    """One GPU as a device of the slice (see the module's docstring for what it holds)."""
    attributes: dict[str, Any] = {
        "index": {"int": gpu.index},
        "uuid": _text(gpu.uuid),
        "model": _text(label_safe(gpu.model)),
        "productName": _text(gpu.model),
        "memoryMiB": {"int": gpu.memory_mib},
    }
    if gpu.numa_node is not None:
        attributes["numaNode"] = {"int": gpu.numa_node}
    by_uuid = {p.uuid: p for p in peers}
    linked = sorted(device_name(by_uuid[u]) for u in gpu.nvlink_peers if u in by_uuid)
    if linked:
        attributes["nvlinkPeers"] = _text(",".join(linked))
    if driver_version:
        attributes["driverVersion"] = _text(driver_version)
    if semver(cuda_version):
        attributes["cudaDriverVersion"] = {"version": semver(cuda_version)}
    memory = gpu.memory_mib * MIB
    return {
        "name": device_name(gpu),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            COMPUTE: {"value": str(WHOLE_GPU_MILLI), "requestPolicy": {
                "default": str(WHOLE_GPU_MILLI),
                "validRange": {"min": str(MIN_SHARE_MILLI), "max": str(WHOLE_GPU_MILLI),
                               "step": str(SHARE_STEP_MILLI)}}},
            MEMORY: {"value": str(memory), "requestPolicy": {
                "default": str(memory),
                "validRange": {"min": str(MIB), "max": str(memory), "step": str(MIB)}}},
        },
    }


def slice_devices(gpus: Sequence[GpuDevice], driver_version: str | None = None,
                  cuda_version: str | None = None) -> list[dict[str, Any]]:
    return [gpu_device(g, gpus, driver_version, cuda_version) for g in sorted(gpus, key=lambda g: g.index)]


def resource_slice(node: str, node_uid: str, devices: list[dict[str, Any]], generation: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION, "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "labels": {"app.kubernetes.io/managed-by": "tessera"},
            # The garbage collector deletes the slice with its node.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                 "controller": True}],
        },
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }


class SliceApi:
    """The few calls the publisher makes, on the API server (in-cluster, or a host for tests)."""

    def __init__(self, *, host: str | None = None, token: str | None = None, timeout_s: float = 5.0) -> None:
        self.api_client = kube_api_client(host=host, token=token)
        self.resource = client.ResourceV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.timeout_s = timeout_s

    def _json(self, resp: Any) -> dict:
        try:
            return json.loads(resp.data or b"{}")
        finally:
            resp.release_conn()

    def get_slice(self, name: str) -> dict | None:
        try:
            return self._json(self.resource.read_resource_slice(name, _preload_content=False,
                                                                _request_timeout=self.timeout_s))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def node_uid(self, node: str) -> str:
        return self._json(self.core.read_node(node, _preload_content=False,
                                              _request_timeout=self.timeout_s))["metadata"]["uid"]

    def create_slice(self, body: dict) -> dict:
        return self._json(self.resource.create_resource_slice(body, _preload_content=False,
                                                              _request_timeout=self.timeout_s))

    def replace_slice(self, body: dict) -> dict:
        return self._json(self.resource.replace_resource_slice(body["metadata"]["name"], body,
                                                               _preload_content=False,
                                                               _request_timeout=self.timeout_s))

    def delete_slice(self, name: str) -> None:
        try:
            self._json(self.resource.delete_resource_slice(name, _preload_content=False,
                                                           _request_timeout=self.timeout_s))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def close(self) -> None:
        self.api_client.close()


class SlicePublisher:
    """Keeps this node's slice equal to its GPUs (see the module's docstring)."""

    MAX_CONFLICTS = 5

    def __init__(self, api: SliceApi, node: str) -> None:
        self.api = api
        self.node = node
        self.writes = 0  # creates and replaces sent (a steady node sends none)

    def sync(self, gpus: Sequence[GpuDevice], driver_version: str | None = None,
             cuda_version: str | None = None) -> dict:
        """The stored slice after making it match `gpus`."""
        devices = slice_devices(gpus, driver_version, cuda_version)
        for _ in range(self.MAX_CONFLICTS):
            current = self.api.get_slice(slice_name(self.node))
            try:
                if current is None:
                    body = resource_slice(self.node, self.api.node_uid(self.node), devices, generation=1)
                    self.writes += 1
                    made = self.api.create_slice(body)
                    log.info("published ResourceSlice %s with %d GPUs", slice_name(self.node), len(devices))
                    return made
                if current["spec"].get("devices") == devices:
                    return current
                generation = int(current["spec"]["pool"]["generation"]) + 1
                owner = current["metadata"]["ownerReferences"][0]["uid"] if current["metadata"].get(
                    "ownerReferences") else self.api.node_uid(self.node)
                body = resource_slice(self.node, owner, devices, generation)
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                self.writes += 1
                made = self.api.replace_slice(body)
                log.info("ResourceSlice %s: generation %d, %d GPUs", slice_name(self.node), generation, len(devices))
                return made
            except ApiException as exc:
                if exc.status != 409:  # a conflict: someone wrote it meanwhile; read it again
                    raise
        raise RuntimeError(f"ResourceSlice {slice_name(self.node)}: still conflicting after "
                           f"{self.MAX_CONFLICTS} tries")

    def withdraw(self) -> None:
        """Delete the slice (the driver is being uninstalled from the node)."""
        self.api.delete_slice(slice_name(self.node))

    def run(self, read: Callable[[], tuple[Sequence[GpuDevice], str | None, str | None]],
            stop: threading.Event, every_s: float = 30.0) -> None:
        """Sync now and every `every_s` until `stop` (a slice deleted by hand comes back; a GPU that
        disappears or returns changes the generation). `read` gives (GPUs, driver, CUDA version)."""
        while True:
            try:
                self.sync(*read())
            except (ApiException, urllib3.exceptions.HTTPError, OSError, RuntimeError) as exc:
                log.warning("ResourceSlice %s: %s; trying again", slice_name(self.node), exc)
            if stop.wait(every_s):
                return
