"""The NVML source against a stand-in `pynvml` module (the third-party library, not our code).

The stand-in mirrors the nvidia-ml-py calls the source uses, with their real conventions: memory in
bytes, power in milliwatts, errors as NVMLError carrying an NVML return code, PCI bus IDs in NVML's
spelling, per-process utilization samples filtered by a last-seen timestamp.
"""

from __future__ import annotations

import asyncio
import json
import logging
import types
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.cgroup import CgroupResolver
from agents.gpus.nvml import GpuSourceError, NvmlSource, normalize_bus_id
from agents.placements import PlacementTable
from agents.sampling import Sampler
from wire.agent_portal import Placements, Sample

MIB = 1024 * 1024
NOT_SUPPORTED, NOT_FOUND, INVALID_ARGUMENT, GPU_IS_LOST, DRIVER_NOT_LOADED = 3, 6, 2, 15, 9


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str
    total_mib: int
    used_mib: int = 0
    util: tuple[int, int] | None = (0, 0)
    power_mw: int | None = 50_000
    temp: int = 40
    numa: int | None = 0  # None: nvmlDeviceGetNumaNodeId not supported
    mig: tuple[int, int] | None = (0, 0)  # None: not supported
    links: list[tuple[str, bool]] = field(default_factory=list)  # (remote bus id, is NVSwitch)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    process_samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, ts, sm)
    lost: bool = False


def fake_pynvml(gpus: list[FakeGpu], init_error: int | None = None) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    nvml.NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    nvml.NVML_FEATURE_ENABLED = 1
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.NVML_DEVICE_MIG_ENABLE = 1
    nvml.NVML_NVLINK_MAX_LINKS = 18
    nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    nvml.process_queries: list[tuple[str, int]] = []
    nvml.shut_down = False

    def live(h: FakeGpu) -> FakeGpu:
        if h.lost:
            raise NVMLError(GPU_IS_LOST)
        return h

    def init() -> None:
        if init_error is not None:
            raise NVMLError(init_error)

    def link(h: FakeGpu, i: int) -> tuple[str, bool]:
        if not h.links:
            raise NVMLError(NOT_SUPPORTED)
        if i >= len(h.links):
            raise NVMLError(INVALID_ARGUMENT)
        return h.links[i]

    def numa(h: FakeGpu) -> int:
        if h.numa is None:
            raise NVMLError(NOT_SUPPORTED)
        return h.numa

    def mig(h: FakeGpu) -> list[int]:
        if h.mig is None:
            raise NVMLError(NOT_SUPPORTED)
        return list(h.mig)

    def util(h: FakeGpu) -> types.SimpleNamespace:
        if live(h).util is None:
            raise NVMLError(NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=h.util[0], memory=h.util[1])

    def power(h: FakeGpu) -> int:
        if h.power_mw is None:
            raise NVMLError(NOT_SUPPORTED)
        return h.power_mw

    def process_util(h: FakeGpu, since: int) -> list[types.SimpleNamespace]:
        nvml.process_queries.append((h.uuid, since))
        found = [types.SimpleNamespace(pid=p, timeStamp=ts, smUtil=sm, memUtil=0)
                 for p, ts, sm in h.process_samples if ts > since]
        if not found:
            raise NVMLError(NOT_FOUND)
        return found

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: setattr(nvml, "shut_down", True)
    nvml.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    nvml.nvmlDeviceGetUUID = lambda h: h.uuid
    nvml.nvmlDeviceGetName = lambda h: h.name.encode()  # older bindings return bytes
    nvml.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h.bus_id.encode())
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=live(h).total_mib * MIB, used=h.used_mib * MIB, free=(h.total_mib - h.used_mib) * MIB)
    nvml.nvmlDeviceGetNvLinkState = lambda h, i: (link(h, i), 1)[1]
    nvml.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, i: types.SimpleNamespace(busId=link(h, i)[0])
    nvml.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, i: 2 if link(h, i)[1] else 0
    nvml.nvmlDeviceGetNumaNodeId = numa
    nvml.nvmlDeviceGetMigMode = mig
    nvml.nvmlDeviceGetUtilizationRates = util
    nvml.nvmlDeviceGetPowerUsage = power
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: live(h).temp
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=p, usedGpuMemory=used) for p, used in live(h).processes]
    nvml.nvmlDeviceGetProcessUtilization = process_util
    return nvml


UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]
BUS = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0"]


def three_gpus() -> list[FakeGpu]:
    return [
        # GPU 0 and 1: a direct NVLink pair (two links between them).
        FakeGpu(UUIDS[0], "NVIDIA A100-SXM4-80GB", BUS[0], 81920, used_mib=1024, util=(63, 20),
                power_mw=251_437, temp=61, links=[(BUS[1], False), (BUS[1], False)],
                processes=[(4242, 2048 * MIB), (4343, None)],
                process_samples=[(4242, 100, 10), (4242, 200, 55), (4343, 150, 7)]),
        FakeGpu(UUIDS[1], "NVIDIA A100-SXM4-80GB", BUS[1], 81920, util=None, numa=None, mig=(1, 1),
                links=[(BUS[0], False)]),
        # GPU 2: no NVLink, no NUMA from NVML or sysfs, no MIG support, no power reading.
        FakeGpu(UUIDS[2], "Tesla T4", BUS[2], 15360, numa=None, mig=None, power_mw=None),
    ]


@pytest.fixture
def sysfs(tmp_path):
    # The kernel's view, used when NVML cannot tell the NUMA node.
    for bus, node in ((BUS[1], "1"), (BUS[2], "-1")):
        device = tmp_path / "bus" / "pci" / "devices" / normalize_bus_id(bus)
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{node}\n")
    return tmp_path


def test_discovery_reports_uuid_model_memory_nvlink_numa_and_mig(sysfs):
    source = NvmlSource(fake_pynvml(three_gpus()), sysfs_root=sysfs)
    a, b, t4 = source.devices()
    assert (a.index, a.uuid, a.model, a.memory_mib) == (0, UUIDS[0], "NVIDIA A100-SXM4-80GB", 81920)
    assert a.nvlink_peers == (UUIDS[1],) and b.nvlink_peers == (UUIDS[0],) and t4.nvlink_peers == ()
    assert (a.numa_node, b.numa_node, t4.numa_node) == (0, 1, None)
    assert (a.mig_mode, b.mig_mode, t4.mig_mode) == ("disabled", "enabled", "unsupported")
    assert source.driver_version() == "550.54.15"


def test_gpus_on_an_nvswitch_are_all_peers_of_each_other(sysfs):
    switch = "00000000:C1:00.0"
    gpus = [FakeGpu(UUIDS[i], "NVIDIA H100 80GB HBM3", BUS[i], 81559, links=[(switch, True)] * 2)
            for i in range(4)]
    devices = NvmlSource(fake_pynvml(gpus), sysfs_root=sysfs).devices()
    for d in devices:
        assert set(d.nvlink_peers) == set(UUIDS) - {d.uuid}


def test_readings_convert_units_and_report_unsupported_values_as_null(sysfs):
    source = NvmlSource(fake_pynvml(three_gpus()), sysfs_root=sysfs)
    reading = source.read()
    a, b, t4 = reading.gpus
    assert (a.sm_util_pct, a.mem_util_pct, a.mem_used_mib, a.power_w, a.temp_c) == (63, 20, 1024, 251.4, 61)
    assert (b.sm_util_pct, b.mem_util_pct) == (None, None)  # MIG mode: no device utilization
    assert t4.power_w is None


def test_processes_get_memory_and_their_latest_utilization_sample(sysfs):
    nvml = fake_pynvml(three_gpus())
    source = NvmlSource(nvml, sysfs_root=sysfs)
    procs = {p.pid: p for p in source.read().processes}
    assert (procs[4242].gpu_uuid, procs[4242].mem_used_mib, procs[4242].sm_util_pct) == (UUIDS[0], 2048, 55)
    assert (procs[4343].mem_used_mib, procs[4343].sm_util_pct) == (None, 7)
    # The next reading asks only for samples newer than the newest one seen.
    nvml.process_queries.clear()
    procs = {p.pid: p for p in source.read().processes}
    assert (UUIDS[0], 200) in nvml.process_queries
    assert procs[4242].sm_util_pct is None  # no fresh sample: unknown, not a stale number


def test_a_lost_gpu_is_skipped_and_logged_once_while_the_others_keep_reporting(sysfs, caplog):
    gpus = three_gpus()
    source = NvmlSource(fake_pynvml(gpus), sysfs_root=sysfs)
    gpus[1].lost = True
    with caplog.at_level(logging.WARNING):
        first, second = source.read(), source.read()
    assert [g.uuid for g in first.gpus] == [UUIDS[0], UUIDS[2]] == [g.uuid for g in second.gpus]
    assert sum("cannot be read" in r.message for r in caplog.records) == 1
    gpus[1].lost = False
    assert len(source.read().gpus) == 3


def test_a_machine_without_a_driver_gets_a_clear_error():
    with pytest.raises(GpuSourceError, match=r"cannot initialise NVML.*--simulate"):
        NvmlSource(fake_pynvml([], init_error=DRIVER_NOT_LOADED))


def test_nvml_samples_go_through_the_same_pipeline_and_validate(sysfs, tmp_path):
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    pod = "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f"
    (proc / "4242" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod.replace('-', '_')}.slice/"
        f"cri-containerd-{'ab' * 32}.scope\n")
    nvml = fake_pynvml(three_gpus())
    source = NvmlSource(nvml, sysfs_root=sysfs)
    table = PlacementTable({d.uuid for d in source.devices()})
    table.apply(Placements.model_validate({"v": 1, "type": "placements", "revision": 1, "placements": [
        {"reservation": "r-7", "gpu_uuid": UUIDS[0], "request": 0.5, "limit": 1.0, "memory_mib": 8192,
         "pod_uid": pod}]}))
    seq, text = Sampler(source, table, CgroupResolver(proc)).take()
    sample = Sample.model_validate(json.loads(text))
    assert seq == sample.seq == 1
    owned = next(p for p in sample.processes if p.pid == 4242)
    assert (owned.pod_uid, owned.container_id, owned.reservation) == (pod, "ab" * 32, "r-7")
    stray = next(p for p in sample.processes if p.pid == 4343)
    assert (stray.pod_uid, stray.reservation) == (None, None)
    source.close()
    assert nvml.shut_down


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    used=st.integers(0, 2**45), util=st.integers(0, 2**31), power=st.integers(0, 2**31),
    temp=st.integers(-300, 2**31), pid=st.integers(0, 2**32 - 1), proc_used=st.integers(0, 2**45),
    sm=st.integers(0, 2**31),
)
def test_whatever_the_sensors_say_the_sample_stays_valid(sysfs, used, util, power, temp, pid, proc_used, sm):
    # One impossible value must never make the portal refuse a whole batch.
    gpu = FakeGpu(UUIDS[0], "NVIDIA A100-SXM4-80GB", BUS[0], 81920, used_mib=used // MIB, util=(util, util),
                  power_mw=power, temp=temp, processes=[(pid, proc_used)], process_samples=[(pid, 1, sm)])
    source = NvmlSource(fake_pynvml([gpu]), sysfs_root=sysfs)
    table = PlacementTable({UUIDS[0]})
    _, text = Sampler(source, table).take()
    Sample.model_validate(json.loads(text))


@pytest.mark.asyncio
async def test_an_nvml_agent_registers_its_gpus_and_streams_attributed_samples(portal, sysfs, tmp_path):
    from agents.agent import Agent, AgentSettings

    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    pod = "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f"
    (proc / "4242" / "cgroup").write_text(f"0::/kubepods/burstable/pod{pod}/{'cd' * 32}\n")
    source = NvmlSource(fake_pynvml(three_gpus()), sysfs_root=sysfs)
    table = PlacementTable({d.uuid for d in source.devices()})
    portal.first_messages.append({"v": 1, "type": "placements", "revision": 1, "placements": [
        {"reservation": "r-7", "gpu_uuid": UUIDS[0], "request": 0.5, "limit": 1.0, "memory_mib": None,
         "pod_uid": pod}]})
    agent = Agent(AgentSettings(url=portal.url, token=portal.token, node="gpu-node-1", interval_s=0.05),
                  source, table, CgroupResolver(proc))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await portal.wait_for(lambda: table.revision == 1)
        placed_from = agent.sampler.seq + 1
        await portal.wait_for(lambda: portal.last_seq >= placed_from)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    hello = portal.hellos[0]
    assert (hello.source, hello.driver_version) == ("nvml", "550.54.15")
    assert [g.uuid for g in hello.gpus] == UUIDS[:3]
    owned = next(p for p in portal.stored[placed_from]["processes"] if p["pid"] == 4242)
    assert (owned["pod_uid"], owned["reservation"]) == (pod, "r-7")
