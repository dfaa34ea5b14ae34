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
from agents.inventory import InventoryNode
from agents.placements import PlacementTable
from wire.agent_portal import Placement

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
    return [b + spare * e / total_excess for b, e in zip(base, excess, strict=True)]


def simulated_pid(reservation: str) -> int:
    """A stable, plausible pid for the simulated process of a reservation."""
    return 100_000 + zlib.crc32(reservation.encode()) % 3_000_000


class SimulatedSource:
    kind: Literal["simulated"] = "simulated"

    def __init__(self, node: InventoryNode, placements: PlacementTable, seed: int | None = None) -> None:
        self.node = node
        self.placements = placements
        self._rng = random.Random(seed)
        self._demand: dict[str, float] = {}
        self._temp: dict[str, float] = {g.uuid: 32.0 for g in node.gpus}

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

    def _level(self, reservation: str) -> float:
        # How busy this reservation's job is on average: 0.35..1.0, fixed per reservation.
        return 0.35 + 0.65 * (zlib.crc32(b"level:" + reservation.encode()) % 1000) / 999

    def _step_demand(self, placements: tuple[Placement, ...]) -> None:
        live = {p.reservation for p in placements}
        for gone in set(self._demand) - live:
            del self._demand[gone]
        for reservation in live:
            level = self._level(reservation)
            d = self._demand.get(reservation, level)
            d += 0.3 * (level - d) + self._rng.gauss(0.0, 0.06)
            self._demand[reservation] = min(1.0, max(0.0, d))

    def read(self) -> Reading:
        placed = self.placements.all()
        self._step_demand(placed)
        reading = Reading(gpus=[])
        for gpu in self.node.gpus:
            on_gpu = [p for p in placed if p.gpu_uuid == gpu.uuid]
            used = share_usage(
                [self._demand[p.reservation] for p in on_gpu],
                [p.request for p in on_gpu],
                [p.limit for p in on_gpu],
            )
            mem_total = 0
            for p, frac in zip(on_gpu, used, strict=True):
                cap = p.memory_mib or int(gpu.memory_mib * p.request)
                demand = self._demand[p.reservation]
                mem = min(cap, DRIVER_OVERHEAD_MIB + int(cap * (0.5 + 0.4 * demand)))
                mem_total += mem
                reading.processes.append(
                    ProcessReading(
                        pid=simulated_pid(p.reservation),
                        gpu_uuid=gpu.uuid,
                        mem_used_mib=mem,
                        sm_util_pct=round(100 * frac),
                        pod_uid=p.pod_uid,
                        reservation=p.reservation,
                    )
                )
                reading.shares.append(
                    ShareReading(
                        reservation=p.reservation,
                        gpu_uuid=gpu.uuid,
                        used_frac=round(frac, 4),
                        mem_used_mib=mem,
                    )
                )
            busy = sum(used)
            util = 0 if not on_gpu else max(0, min(100, round(100 * busy + self._rng.gauss(0.0, 1.0))))
            profile = power_profile(gpu.model)
            power = profile.idle_w + (profile.max_w - profile.idle_w) * util / 100
            power = max(0.0, power + self._rng.gauss(0.0, profile.max_w * 0.005))
            # Temperature lags the load, as a heat sink does.
            self._temp[gpu.uuid] += 0.15 * (32.0 + 48.0 * util / 100 - self._temp[gpu.uuid])
            reading.gpus.append(
                GpuReading(
                    uuid=gpu.uuid,
                    sm_util_pct=util,
                    mem_util_pct=max(0, min(100, round(util * 0.6))),
                    mem_used_mib=min(gpu.memory_mib, mem_total),
                    power_w=round(power, 1),
                    temp_c=round(self._temp[gpu.uuid]),
                )
            )
        return reading

    def close(self) -> None:
        pass
