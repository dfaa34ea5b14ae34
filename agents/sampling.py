"""Turns a GPU source's readings into numbered, encoded samples (the protocol's `Sample`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from agents.cgroup import CgroupResolver
from agents.gpus.base import GpuSource, ProcessReading
from agents.placements import PlacementTable
from agents.share_usage import BrokerUsage, with_process_memory
from wire.agent_portal import MAX_PROCESSES_PER_SAMPLE, MAX_SHARES_PER_SAMPLE

log = logging.getLogger(__name__)

# One encoder for every sample: json.dumps() with options builds a new one each call. A sample is
# a fresh tree of dicts and lists built in take(), so it cannot hold a cycle to check for.
_encode_json = json.JSONEncoder(separators=(",", ":"), allow_nan=False, check_circular=False).encode


def attribute(
    processes: list[ProcessReading], placements: PlacementTable, resolver: CgroupResolver | None
) -> None:
    """Fill in each process's pod, container and reservation where the source did not know them."""
    for proc in processes:
        if proc.pod_uid is None and resolver is not None:
            ref = resolver.resolve(proc.pid)
            if ref is not None:
                proc.pod_uid, proc.container_id = ref.pod_uid, ref.container_id
        if proc.reservation is None and proc.pod_uid is not None:
            proc.reservation = placements.reservation_of_pod(proc.pod_uid)


class Sampler:
    """Takes one sample at a time; sequence numbers start at 1 and have no gaps."""

    def __init__(
        self,
        source: GpuSource,
        placements: PlacementTable,
        resolver: CgroupResolver | None = None,
        share_usage: BrokerUsage | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.placements = placements
        self.resolver = resolver
        self.share_usage = share_usage
        self.clock = clock
        self.seq = 0
        self._warned_truncation = False

    def take(self) -> tuple[int, str]:
        """Read the GPUs and return (seq, the sample as compact JSON)."""
        ts_ms = int(self.clock() * 1000)
        reading = self.source.read()
        attribute(reading.processes, self.placements, self.resolver)
        processes = reading.processes
        shares = reading.shares
        if self.share_usage is not None:
            shares = shares + with_process_memory(self.share_usage.read(), processes)
        if len(processes) > MAX_PROCESSES_PER_SAMPLE or len(shares) > MAX_SHARES_PER_SAMPLE:
            # Keep the biggest users; the protocol caps a sample so one batch always fits a frame.
            if not self._warned_truncation:
                log.warning("over %d GPU processes; reporting the largest", MAX_PROCESSES_PER_SAMPLE)
                self._warned_truncation = True
            processes = sorted(processes, key=lambda p: -(p.mem_used_mib or 0))[:MAX_PROCESSES_PER_SAMPLE]
            shares = sorted(shares, key=lambda s: -s.used_frac)[:MAX_SHARES_PER_SAMPLE]
        self.seq += 1
        sample: dict[str, Any] = {
            "seq": self.seq,
            "ts_ms": ts_ms,
            # vars() of these flat dataclasses is their fields in declaration order, which is the
            # wire format; dataclasses.asdict() would deep-copy and cost two thirds of a sample.
            "gpus": [vars(g) for g in reading.gpus],
            "processes": [vars(p) for p in processes],
            "shares": [vars(s) for s in shares],
        }
        return self.seq, _encode_json(sample)
