"""GPU discovery and readings from NVML (`import pynvml`, the nvidia-ml-py package).

Anything a GPU does not support (power on some boards, utilization in MIG mode) is reported as null
rather than failing the whole reading.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from agents.gpus.base import GpuDevice, GpuReading, MigMode, ProcessReading, Reading
from wire.agent_portal import MAX_PID

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class GpuSourceError(RuntimeError):
    """NVML cannot be used on this machine; the message says why and what to do."""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id: Any) -> str:
    """NVML spells PCI addresses "00000000:3B:00.0"; sysfs spells them "0000:3b:00.0"."""
    text = _text(bus_id).strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


class NvmlSource:
    kind: Literal["nvml"] = "nvml"

    def __init__(self, nvml: ModuleType | None = None, sysfs_root: str | Path = "/sys") -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:  # pragma: no cover - the package is a dependency
                raise GpuSourceError(f"pynvml is not installed ({exc}); install nvidia-ml-py") from None
        self._nvml = nvml
        self._sysfs = Path(sysfs_root)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuSourceError(
                f"cannot initialise NVML: {exc}. Is the NVIDIA driver loaded and the device visible "
                "to this container? Use --simulate INVENTORY for a simulated GPU set."
            ) from None
        self._handles: list[Any] = []
        self._devices: list[GpuDevice] = []
        self._last_process_ts: dict[str, int] = {}
        self._lost: set[str] = set()
        self._discover()

    # -- discovery -------------------------------------------------------------------------------

    def _discover(self) -> None:
        nvml = self._nvml
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        bus_ids = [normalize_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        uuid_by_bus = dict(zip(bus_ids, uuids, strict=True))
        direct: list[set[str]] = [set() for _ in handles]
        on_switch: set[int] = set()
        for i, h in enumerate(handles):
            for remote_bus, is_switch in self._nvlinks(h):
                if is_switch:
                    on_switch.add(i)
                elif remote_bus in uuid_by_bus and uuid_by_bus[remote_bus] != uuids[i]:
                    direct[i].add(uuid_by_bus[remote_bus])
        for i, h in enumerate(handles):
            peers = set(direct[i])
            if i in on_switch:
                # NVSwitch systems: every GPU on the switch fabric reaches every other one.
                peers |= {uuids[j] for j in on_switch if j != i}
            memory = nvml.nvmlDeviceGetMemoryInfo(h)
            self._devices.append(
                GpuDevice(
                    index=i,
                    uuid=uuids[i],
                    model=_text(nvml.nvmlDeviceGetName(h)),
                    memory_mib=int(memory.total) // MIB,
                    numa_node=self._numa_node(h, bus_ids[i]),
                    nvlink_peers=tuple(sorted(peers)),
                    mig_mode=self._mig_mode(h),
                )
            )
        self._handles = handles

    def _nvlinks(self, handle: Any) -> list[tuple[str, bool]]:
        nvml = self._nvml
        links = []
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = normalize_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except nvml.NVMLError:
                # NOT_SUPPORTED (no NVLink at all) or INVALID_ARGUMENT past the last link.
                break
            is_switch = False
            try:
                kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                is_switch = kind == getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 1)
            except (nvml.NVMLError, AttributeError):
                pass
            links.append((remote, is_switch))
        return links

    def _numa_node(self, handle: Any, bus_id: str) -> int | None:
        nvml = self._nvml
        try:
            node = int(nvml.nvmlDeviceGetNumaNodeId(handle))
            return node if node >= 0 else None
        except (nvml.NVMLError, AttributeError):
            pass
        # Older drivers: the kernel knows the device's NUMA node (-1 when the machine has one).
        try:
            node = int((self._sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def _mig_mode(self, handle: Any) -> MigMode:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except (nvml.NVMLError, AttributeError):
            return "unsupported"
        return "enabled" if current == nvml.NVML_DEVICE_MIG_ENABLE else "disabled"

    # -- the GpuSource interface -------------------------------------------------------------------

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion()) or None
        except self._nvml.NVMLError:
            return None

    def cuda_version(self) -> str | None:
        try:
            version = int(self._nvml.nvmlSystemGetCudaDriverVersion_v2())  # e.g. 12040 for 12.4
        except (self._nvml.NVMLError, AttributeError):
            return None
        return f"{version // 1000}.{version % 1000 // 10}"

    def read(self) -> Reading:
        reading = Reading(gpus=[])
        for device, handle in zip(self._devices, self._handles, strict=True):
            try:
                reading.gpus.append(self._read_gpu(device, handle))
                reading.processes.extend(self._read_processes(device, handle))
            except self._nvml.NVMLError as exc:
                # One failing GPU (fallen off the bus, reset) must not stop the others' telemetry.
                if device.uuid not in self._lost:
                    log.warning("GPU %s (%s) cannot be read: %s", device.index, device.uuid, exc)
                    self._lost.add(device.uuid)
                continue
            self._lost.discard(device.uuid)
        return reading

    def _optional(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except self._nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def _read_gpu(self, device: GpuDevice, handle: Any) -> GpuReading:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        rates = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        temp = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        return GpuReading(
            uuid=device.uuid,
            sm_util_pct=_percent(rates.gpu) if rates is not None else None,
            mem_util_pct=_percent(rates.memory) if rates is not None else None,
            mem_used_mib=max(0, min(int(memory.used) // MIB, device.memory_mib)),
            power_w=_in_range(round(power_mw / 1000.0, 1), 0.0, 5000.0) if power_mw is not None else None,
            temp_c=_in_range(int(temp), -40, 150) if temp is not None else None,
        )

    def _read_processes(self, device: GpuDevice, handle: Any) -> list[ProcessReading]:
        nvml = self._nvml
        procs = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        utils: dict[int, int] = {}
        try:
            since = self._last_process_ts.get(device.uuid, 0)
            newest: dict[int, tuple[int, int]] = {}
            for s in nvml.nvmlDeviceGetProcessUtilization(handle, since):
                if s.pid not in newest or s.timeStamp > newest[s.pid][0]:
                    newest[s.pid] = (s.timeStamp, s.smUtil)
            if newest:
                self._last_process_ts[device.uuid] = max(ts for ts, _ in newest.values())
            utils = {pid: util for pid, (_, util) in newest.items()}
        except nvml.NVMLError:
            # NOT_FOUND: no sample since `since`; NOT_SUPPORTED: older boards. Memory still counts.
            pass
        readings = []
        for p in procs:
            if not 1 <= int(p.pid) <= MAX_PID:
                continue  # not a Linux pid; nothing could be attributed to it anyway
            used = getattr(p, "usedGpuMemory", None)
            mem = max(0, min(int(used) // MIB, device.memory_mib)) if used is not None else None
            readings.append(
                ProcessReading(
                    pid=int(p.pid),
                    gpu_uuid=device.uuid,
                    mem_used_mib=mem,
                    sm_util_pct=_percent(utils[p.pid]) if p.pid in utils else None,
                )
            )
        return readings

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _percent(value: Any) -> int:
    return max(0, min(100, int(value)))


def _in_range(value: Any, low: Any, high: Any) -> Any:
    # A sensor reading outside what any GPU can do is a broken sensor: report it as unknown, because
    # one impossible value would make the portal refuse the whole batch it travels in.
    return value if low <= value <= high else None
