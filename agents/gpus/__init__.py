"""Where GPU readings come from: NVML on a real node, or a simulated GPU set from an inventory."""

from agents.gpus.base import GpuDevice, GpuReading, GpuSource, ProcessReading, Reading, ShareReading

__all__ = ["GpuDevice", "GpuReading", "GpuSource", "ProcessReading", "Reading", "ShareReading"]
