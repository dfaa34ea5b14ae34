"""A share as the cluster carries it to the node: the placement annotation on the pod and the
container's variables. The Kubernetes backend writes both (scheduler/backends/base.py); the device
plugin and the DRA driver read the annotation and give the container the same variables
(agents/deviceplugin, agents/dra), so a portal pod and a kubectl pod get the very same terms.

The annotation (`tessera.io/placement`) is compact JSON with sorted keys:
``{"gpus": ["GPU-..."], "limit": 0.5, "memory_mib": 8192, "priority": "high", "request": 0.25,
"reservation": "12"}``. It reaches the node through the API server, so the reader validates it like
any outside input. The variables (preload/README.md): NVIDIA_VISIBLE_DEVICES (the GPU UUIDs,
comma-separated), LD_PRELOAD, TESSERA_GPU_REQUEST, TESSERA_GPU_LIMIT, TESSERA_GPU_MEMORY_LIMIT
(``<n>Mi``), TESSERA_PRIORITY, TESSERA_SHARE_ID (the reservation id), TESSERA_BROKER_SOCKET.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from wire.agent_portal import GPU_UUID_PATTERN, MAX_MEMORY_MIB, RESERVATION_PATTERN

PLACEMENT_ANNOTATION = "tessera.io/placement"
MAX_ANNOTATION_BYTES = 4096
MAX_GPUS = 16


class PlacementError(ValueError):
    """The pod's placement annotation is missing or wrong; the message says which field."""


class PodPlacement(BaseModel):
    """A pod's placement annotation as the node reads it: its reservation, GPUs and terms."""

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

    def env(self, *, preload: str, broker_socket: str) -> dict[str, str]:
        """The container's variables for this placement; `preload` and `broker_socket` are where the
        node mounts the library and the broker's socket."""
        return share_env(self.reservation, self.gpus, self.request, self.limit, self.memory_mib, self.priority,
                         preload=preload, broker_socket=broker_socket)


def encode(reservation: str, gpus: Sequence[str], request: float, limit: float, memory_mib: int,
           priority: str) -> str:
    """The annotation's text (the writer's side: its values are the engine's, already checked)."""
    return json.dumps({"reservation": reservation, "gpus": list(gpus), "request": request, "limit": limit,
                       "memory_mib": memory_mib, "priority": priority}, separators=(",", ":"), sort_keys=True)


def parse_placement(annotations: Mapping[str, str] | None) -> PodPlacement:
    """The pod's placement from its annotations; PlacementError names what is missing or wrong."""
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


def share_env(reservation: str, gpus: Sequence[str], request: float, limit: float, memory_mib: int, priority: str,
              *, preload: str, broker_socket: str) -> dict[str, str]:
    """The variables the preload library, the broker and the NVIDIA runtime read."""
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(gpus),
        "LD_PRELOAD": preload,
        "TESSERA_GPU_REQUEST": f"{request:g}",
        "TESSERA_GPU_LIMIT": f"{limit:g}",
        "TESSERA_GPU_MEMORY_LIMIT": f"{memory_mib}Mi",
        "TESSERA_PRIORITY": priority,
        "TESSERA_SHARE_ID": reservation,
        "TESSERA_BROKER_SOCKET": broker_socket,
    }
