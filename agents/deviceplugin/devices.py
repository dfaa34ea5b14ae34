"""The devices the plugin advertises: each GPU as a number of share slots, so that many pods can
hold "a piece" of one GPU at once. The kubelet only counts slots; which GPU and how big a share a pod
gets is the scheduler's decision, carried by the pod's placement annotation."""

from __future__ import annotations

import re
from collections.abc import Iterable

from agents.gpus.base import GpuDevice

from . import api_pb2

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEFAULT_SLOTS_PER_GPU = 16
MAX_SLOTS_PER_GPU = 256
_SEP = "::"


def slot_id(gpu_uuid: str, slot: int) -> str:
    return f"{gpu_uuid}{_SEP}{slot}"


_SLOT = re.compile(rf"^(?P<gpu>.+){_SEP}(?P<slot>\d+)$")


def gpu_of(device_id: str) -> str | None:
    m = _SLOT.match(device_id)
    return m["gpu"] if m else None


def share_devices(gpus: Iterable[GpuDevice], slots_per_gpu: int,
                  unhealthy: frozenset[str] = frozenset()) -> list[api_pb2.Device]:
    if not 1 <= slots_per_gpu <= MAX_SLOTS_PER_GPU:
        raise ValueError(f"slots per GPU: {slots_per_gpu} is not within 1..{MAX_SLOTS_PER_GPU}")
    out = []
    for gpu in gpus:
        topology = (api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa_node)])
                    if gpu.numa_node is not None else None)
        health = UNHEALTHY if gpu.uuid in unhealthy else HEALTHY
        out.extend(api_pb2.Device(ID=slot_id(gpu.uuid, k), health=health, topology=topology)
                   for k in range(slots_per_gpu))
    return out
