"""What the device plugin gives a container: read the placement the scheduler wrote on the pod,
turn it into the container's environment and mounts.

The placement annotation (`tessera.io/placement`, written by the portal's Kubernetes backend before
it binds the pod) is compact JSON:
``{"reservation": "12", "gpus": ["GPU-..."], "request": 0.25, "limit": 0.5, "memory_mib": 8192,
"priority": "high"}``. It comes from the API server, so it is validated like any outside input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from wire.agent_portal import GPU_UUID_PATTERN, MAX_MEMORY_MIB, RESERVATION_PATTERN

from . import api_pb2

PLACEMENT_ANNOTATION = "tessera.io/placement"
RESERVATION_LABEL = "tessera.io/reservation"
MAX_ANNOTATION_BYTES = 4096
MAX_GPUS = 16


class PlacementError(ValueError):
    """The pod's placement annotation is missing or wrong; the message says which field."""


class PodPlacement(BaseModel):
    """A pod's placement annotation as the device plugin reads it: its reservation, GPUs and terms."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reservation: Annotated[str, Field(pattern=RESERVATION_PATTERN)]
    gpus: Annotated[list[Annotated[str, Field(pattern=GPU_UUID_PATTERN, max_length=96)]],
                    Field(min_length=1, max_length=MAX_GPUS)]
    request: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
    limit: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
    memory_mib: Annotated[StrictInt, Field(ge=1, le=MAX_MEMORY_MIB)]
    priority: Literal["high", "normal", "low"]

    @model_validator(mode="after")
    def _consistent(self) -> PodPlacement:
        if self.limit < self.request:
            raise ValueError(f"limit {self.limit} is below request {self.request}")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError("gpus: the same GPU twice")
        return self


def parse_placement(annotations: dict[str, str] | None) -> PodPlacement:
    text = (annotations or {}).get(PLACEMENT_ANNOTATION)
    if text is None:
        raise PlacementError(f"the pod has no {PLACEMENT_ANNOTATION} annotation (not placed by Tessera)")
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise PlacementError(f"{PLACEMENT_ANNOTATION}: longer than {MAX_ANNOTATION_BYTES} bytes")
    try:
        return PodPlacement.model_validate(json.loads(text))
    except ValueError as exc:  # JSON errors and pydantic's ValidationError alike
        if isinstance(exc, ValidationError):
            fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'placement'}: {e['msg']}" for e in exc.errors())
            raise PlacementError(f"{PLACEMENT_ANNOTATION}: {fields}") from exc
        raise PlacementError(f"{PLACEMENT_ANNOTATION}: not JSON ({exc})") from exc


@dataclass(frozen=True)
class NodePaths:
    """Where the node keeps the preload library and the broker socket (same path in the container)."""

    preload_dir: str = "/opt/tessera/lib"
    preload_library: str = "libtessera_preload.so"
    # beside the library, one line naming it: mounted as the container's /etc/ld.so.preload
    preload_list: str = "ld.so.preload"
    broker_dir: str = "/run/tessera"
    broker_socket: str = "broker.sock"


# The dynamic loader reads this file in every process it starts, whatever the environment says.
LD_SO_PRELOAD = "/etc/ld.so.preload"


# The device nodes a CUDA process opens besides its GPUs' own (/dev/nvidia<minor>).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def device_specs(minors: list[int]) -> list[api_pb2.DeviceSpec]:
    """The GPUs' device nodes for the container, for nodes whose runtime does not add them itself
    (no NVIDIA container runtime reading NVIDIA_VISIBLE_DEVICES): `--pass-device-specs`."""
    return [api_pb2.DeviceSpec(container_path=path, host_path=path, permissions="rw")
            for path in (*(f"/dev/nvidia{m}" for m in minors), *CONTROL_DEVICES)]


def container_response(placement: PodPlacement, paths: NodePaths,
                       minors: list[int] | None = None) -> api_pb2.ContainerAllocateResponse:
    """Env, mounts (and with `minors`, the GPUs' device nodes) for one container of the placed pod
    (see preload/README.md for the variables): the library both in LD_PRELOAD and in the container's
    /etc/ld.so.preload, the broker's socket directory read-only."""
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(placement.gpus),
        "LD_PRELOAD": f"{paths.preload_dir}/{paths.preload_library}",
        "TESSERA_GPU_REQUEST": f"{placement.request:g}",
        "TESSERA_GPU_LIMIT": f"{placement.limit:g}",
        "TESSERA_GPU_MEMORY_LIMIT": f"{placement.memory_mib}Mi",
        "TESSERA_PRIORITY": placement.priority,
        "TESSERA_SHARE_ID": placement.reservation,
        "TESSERA_BROKER_SOCKET": f"{paths.broker_dir}/{paths.broker_socket}",
    }
    mounts = [
        api_pb2.Mount(container_path=paths.preload_dir, host_path=paths.preload_dir, read_only=True),
        # LD_PRELOAD is the container's to unset; /etc/ld.so.preload, a read-only bind mount, is not
        # (preload/README.md says what still gets around it)
        api_pb2.Mount(container_path=LD_SO_PRELOAD, host_path=f"{paths.preload_dir}/{paths.preload_list}",
                      read_only=True),
        # read-only: a workload connects to the socket (connect needs no write access to the mount)
        # but can neither replace it nor plant another in the directory
        api_pb2.Mount(container_path=paths.broker_dir, host_path=paths.broker_dir, read_only=True),
    ]
    return api_pb2.ContainerAllocateResponse(envs=envs, mounts=mounts,
                                             devices=device_specs(minors) if minors is not None else [])
