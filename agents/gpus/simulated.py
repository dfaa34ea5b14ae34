"""A simulated GPU set from an inventory node, whose load follows what the portal placed on it.

Each placed share has a demand that wanders (a mean-reverting random walk around a level fixed per
reservation). A share uses its demand but never more than its limit; when the shares on one GPU
want more than the whole GPU, each first gets up to its request and the rest is split in proportion
to what they still want, which is what the share broker guarantees on a real node. GPU utilization,
memory, power and temperature are derived from the shares' use, with a little noise.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Literal

from agents.gpus.base import GpuDevice, GpuReading, ProcessReading, Reading, ShareReading
from agents.placements import PlacementTable
from wire.agent_portal import PlacedShare
from wire.inventory import InventoryNode

DRIVER_VERSION = "simulated"
DRIVER_OVERHEAD_MIB = 420  # the CUDA context a real process holds before it allocates anything


@dataclass(frozen=True)
class PowerProfile:
    idle_w: float
    max_w: float


_POWER = {"H100": PowerProfile(70, 700), "A100": PowerProfile(55, 400), "V100": PowerProfile(40, 300),
          "T4": PowerProfile(10, 70), "L4": PowerProfile(12, 72)}
_DEFAULT_POWER = PowerProfile(30, 250)


def power_profile(model: str) -> PowerProfile:
    upper = model.upper()
    for key, profile in _POWER.items():
        if key in upper:
            return profile
    return _DEFAULT_POWER


def share_usage(wants: list[float], requests: list[float], limits: list[float]) -> list[float]:
    """GPU fractions the shares on one GPU get, given what each wants (0..1)."""
    want = [max(0.0, min(w, lim)) for w, lim in zip(wants, limits, strict=True)]
    if sum(want) <= 1.0:
        return want
    base = [min(w, r) for w, r in zip(want, requests, strict=True)]
    spare = max(0.0, 1.0 - sum(base))
    excess = [w - b for w, b in zip(want, base, strict=True)]
    total_excess = sum(excess)
    if total_excess <= 0.0:  # the requests alone fill the GPU (their sum above 1 by rounding only)
        return base
    return [b + spare * e / total_excess for b, e in zip(base, excess, strict=True)]


def simulated_pid(reservation: str) -> int:
    """A stable, plausible pid for the simulated process of a reservation."""
    return 100_000 + zlib.crc32(reservation.encode()) % 3_000_000


def demand_level(reservation: str) -> float:
    """How busy a reservation's job is on average: 0.35..1.0, fixed per reservation."""
    return 0.35 + 0.65 * (zlib.crc32(b"level:" + reservation.encode()) % 1000) / 999


@dataclass(frozen=True)
class _Share:
    """One placement with what the simulation derives from it once, not every second."""

    reservation: str
    request: float
    limit: float
    memory_cap_mib: int
    pid: int
    pod_uid: str | None


@dataclass(frozen=True)
class _Gpu:
    """One GPU of the node, its power model and the shares placed on it."""

    uuid: str
    memory_mib: int
    idle_w: float
    span_w: float  # max_w - idle_w
    noise_w: float  # the power sensor's standard deviation
    shares: tuple[_Share, ...]
    requests: list[float]
    limits: list[float]


def _layout(node: InventoryNode, placed: tuple[PlacedShare, ...]) -> list[_Gpu]:
    gpus = []
    for gpu in node.gpus:
        profile = power_profile(gpu.model)
        on_gpu = [p for p in placed if p.gpu_uuid == gpu.uuid]
        gpus.append(_Gpu(
            uuid=gpu.uuid,
            memory_mib=gpu.memory_mib,
            idle_w=profile.idle_w,
            span_w=profile.max_w - profile.idle_w,
            noise_w=profile.max_w * 0.005,
            shares=tuple(
                _Share(p.reservation, p.request, p.limit, p.memory_mib or int(gpu.memory_mib * p.request),
                       simulated_pid(p.reservation), p.pod_uid)
                for p in on_gpu
            ),
            requests=[p.request for p in on_gpu],
            limits=[p.limit for p in on_gpu],
        ))
    return gpus


class SimulatedSource:
    kind: Literal["simulated"] = "simulated"

    def __init__(self, node: InventoryNode, placements: PlacementTable, seed: int | None = None) -> None:
        self.node = node
        self.placements = placements
        self._rng = random.Random(seed)
        self._demand: dict[str, float] = {}
        self._temp = [32.0] * len(node.gpus)  # per GPU, in node order
        # What read() derives from the placements, rebuilt only when the table holds a new tuple (a
        # new placements message): a fleet process reads hundreds of nodes a second.
        self._placed: tuple[PlacedShare, ...] | None = None
        self._levels: list[tuple[str, float]] = []
        self._gpus: list[_Gpu] = []

    def devices(self) -> list[GpuDevice]:
        return [
            GpuDevice(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                numa_node=g.numa_node,
                nvlink_peers=g.nvlink_peers,
                mig_mode="disabled",
            )
            for g in self.node.gpus
        ]

    def driver_version(self) -> str | None:
        return DRIVER_VERSION

    def cuda_version(self) -> str | None:
        return None  # no driver, no CUDA

    def _use(self, placed: tuple[PlacedShare, ...]) -> None:
        live = {p.reservation for p in placed}
        for gone in set(self._demand) - live:
            del self._demand[gone]
        # The demand walk draws its noise in the set's iteration order; kept as it was drawn before.
        self._levels = [(reservation, demand_level(reservation)) for reservation in live]
        self._gpus = _layout(self.node, placed)
        self._placed = placed

    def _step_demand(self) -> None:
        demand, gauss = self._demand, self._rng.gauss
        for reservation, level in self._levels:
            d = demand.get(reservation, level)
            d += 0.3 * (level - d) + gauss(0.0, 0.06)
            demand[reservation] = min(1.0, max(0.0, d))

    def read(self) -> Reading:
        placed = self.placements.all()
        if placed is not self._placed:
            self._use(placed)
        self._step_demand()
        demand, gauss, temp = self._demand, self._rng.gauss, self._temp
        reading = Reading(gpus=[])
        processes, shares, gpus = reading.processes, reading.shares, reading.gpus
        for i, gpu in enumerate(self._gpus):
            util = 0
            mem_total = 0
            if gpu.shares:
                wants = [demand[s.reservation] for s in gpu.shares]
                if len(wants) == 1:
                    # share_usage() of one share: a limit is at most the whole GPU.
                    used = [max(0.0, min(wants[0], gpu.limits[0]))]
                else:
                    used = share_usage(wants, gpu.requests, gpu.limits)
                for share, frac, want in zip(gpu.shares, used, wants, strict=True):
                    cap = share.memory_cap_mib
                    mem = min(cap, DRIVER_OVERHEAD_MIB + int(cap * (0.5 + 0.4 * want)))
                    mem_total += mem
                    processes.append(
                        ProcessReading(
                            pid=share.pid,
                            gpu_uuid=gpu.uuid,
                            mem_used_mib=mem,
                            sm_util_pct=round(100 * frac),
                            pod_uid=share.pod_uid,
                            reservation=share.reservation,
                        )
                    )
                    shares.append(
                        ShareReading(
                            reservation=share.reservation,
                            gpu_uuid=gpu.uuid,
                            used_frac=round(frac, 4),
                            mem_used_mib=mem,
                        )
                    )
                util = max(0, min(100, round(100 * sum(used) + gauss(0.0, 1.0))))
            power = gpu.idle_w + gpu.span_w * util / 100
            power = max(0.0, power + gauss(0.0, gpu.noise_w))
            # Temperature lags the load, as a heat sink does.
            temp[i] += 0.15 * (32.0 + 48.0 * util / 100 - temp[i])
            gpus.append(
                GpuReading(
                    uuid=gpu.uuid,
                    sm_util_pct=util,
                    mem_util_pct=round(util * 0.6),  # util is 0..100
                    mem_used_mib=min(gpu.memory_mib, mem_total),
                    power_w=round(power, 1),
                    temp_c=round(temp[i]),
                )
            )
        return reading

    def close(self) -> None:
        pass
