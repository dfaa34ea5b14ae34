"""The source of a node without GPUs (`tessera-agent --no-gpus`): no NVML is loaded and every
reading is empty. The agent still says hello (the node, its CPU and memory), keeps the node seen,
and measures its links to the GPU nodes whose remote shares its pods may use."""

from __future__ import annotations

from typing import Literal

from agents.gpus.base import GpuDevice, Reading


class NoGpuSource:
    kind: Literal["none"] = "none"

    def devices(self) -> list[GpuDevice]:
        return []

    def driver_version(self) -> str | None:
        return None

    def cuda_version(self) -> str | None:
        return None

    def read(self) -> Reading:
        return Reading(gpus=[])

    def close(self) -> None:
        pass
