"""The GPU-source interface: what the sampler needs from NVML or from the simulator.

Everything after a source's `read()` (process attribution, sequencing, buffering, the stream) is the
same code for both sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

MigMode = Literal["disabled", "enabled", "unsupported"]


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int | None
    nvlink_peers: tuple[str, ...]
    mig_mode: MigMode


@dataclass(frozen=True)
class GpuReading:
    uuid: str
    sm_util_pct: int
    mem_util_pct: int | None
    mem_used_mib: int
    power_w: float | None
    temp_c: int | None


@dataclass
class ProcessReading:
    pid: int
    gpu_uuid: str
    mem_used_mib: int | None
    sm_util_pct: int | None
    # Filled by the source when it knows them (the simulator), else by attribution from the cgroup.
    pod_uid: str | None = None
    container_id: str | None = None
    reservation: str | None = None


@dataclass(frozen=True)
class ShareReading:
    reservation: str
    gpu_uuid: str
    used_frac: float
    mem_used_mib: int | None


@dataclass
class Reading:
    gpus: list[GpuReading]
    processes: list[ProcessReading] = field(default_factory=list)
    shares: list[ShareReading] = field(default_factory=list)


class GpuSource(Protocol):
    kind: Literal["nvml", "simulated", "none"]

    def devices(self) -> list[GpuDevice]:
        """The node's GPUs, discovered once at start."""
        ...

    def driver_version(self) -> str | None: ...

    def cuda_version(self) -> str | None:
        """The CUDA version the driver supports ("12.4"), None when unknown."""
        ...

    def read(self) -> Reading:
        """One reading of every GPU and GPU process; called about once a second."""
        ...

    def close(self) -> None: ...
