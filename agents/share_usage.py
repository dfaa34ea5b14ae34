"""The node's share broker as the agent drives it, on the broker's control socket: each read first
tells it every share's terms (`TERMS`, from the portal's placements: the only terms the broker takes),
then reads the GPU time each share really used (`QUERY` -> `STATS`).

The broker (agents/broker, protocol in preload/PROTOCOL.md) keeps, per GPU and share, the GPU time
the share's processes used since it first saw them (`used_total_s`). The fraction of the GPU a share
used over the last interval is the growth of that counter divided by the wall time between two reads.
Sending the whole table every read (once a second) also re-teaches a broker that restarted.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from agents.broker.protocol import ShareTerms, query_stats
from agents.gpus.base import ProcessReading, ShareReading
from agents.placements import PlacementTable
from wire.agent_portal import RESERVATION_PATTERN

log = logging.getLogger(__name__)



class BrokerUsage:
    def __init__(
        self,
        socket_path: str | Path,
        gpu_uuids: set[str],
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        placements: PlacementTable | None = None,
    ) -> None:
        self.socket_path = str(socket_path)
        self.placements = placements
        self.gpu_uuids = frozenset(gpu_uuids)
        self.timeout_s = timeout_s
        self.clock = clock
        self._totals: dict[tuple[str, str], float] = {}
        self._read_at: float | None = None
        self._failing = False
        self._skipped: set[str] = set()

    def read(self) -> list[ShareReading]:
        """Each share's use since the previous read; [] on the first read or when the broker is away."""
        now = self.clock()
        try:
            stats = query_stats(self.socket_path, self.timeout_s,
                                terms=broker_terms(self.placements) if self.placements is not None else None)
        except (OSError, ValueError) as exc:
            if not self._failing:
                log.warning("share broker at %s does not answer (%s); no per-share GPU time until it does",
                            self.socket_path, exc)
                self._failing = True
            self._read_at = None  # the next good read is a new baseline
            return []
        if self._failing:
            log.info("share broker at %s answers again", self.socket_path)
            self._failing = False
        elapsed = None if self._read_at is None else now - self._read_at
        self._read_at = now
        totals: dict[tuple[str, str], float] = {}
        readings = []
        for gpu, entry in stats["gpus"].items():
            shares = entry.get("shares") if isinstance(entry, dict) else None
            if gpu not in self.gpu_uuids or not isinstance(shares, dict):
                continue
            for share, numbers in shares.items():
                if not re.fullmatch(RESERVATION_PATTERN, share):
                    if share not in self._skipped:
                        log.warning("share broker reports share %r, not a reservation ID; ignored", share)
                        self._skipped.add(share)
                    continue
                used = numbers.get("used_total_s") if isinstance(numbers, dict) else None
                if not isinstance(used, int | float) or used < 0:
                    continue
                totals[(gpu, share)] = float(used)
                before = self._totals.get((gpu, share))
                if elapsed is None or elapsed <= 0 or before is None:
                    continue
                # A counter that went down means the broker restarted or the share left and came back.
                grown = used - before if used >= before else used
                readings.append(ShareReading(
                    reservation=share,
                    gpu_uuid=gpu,
                    used_frac=round(max(0.0, min(1.0, grown / elapsed)), 4),
                    mem_used_mib=None,
                ))
        self._totals = totals
        return readings


def broker_terms(placements: PlacementTable) -> list[ShareTerms]:
    """Every placed share's terms for the broker: a share without a priority (from a portal that does
    not send it) is low, never more; its processes are those of its pod, once the portal knows it."""
    return [ShareTerms(share=p.reservation, gpu=p.gpu_uuid, request=p.request, limit=p.limit,
                       priority=p.priority or "low", pod_uid=p.pod_uid)
            for p in placements.all()]


def with_process_memory(shares: list[ShareReading], processes: list[ProcessReading]) -> list[ShareReading]:
    """Fill each share's memory with what its processes hold on that GPU (known once attributed)."""
    held: dict[tuple[str, str], int] = {}
    for p in processes:
        if p.reservation is not None and p.mem_used_mib is not None:
            key = (p.reservation, p.gpu_uuid)
            held[key] = held.get(key, 0) + p.mem_used_mib
    return [
        s if s.mem_used_mib is not None or (s.reservation, s.gpu_uuid) not in held
        else ShareReading(s.reservation, s.gpu_uuid, s.used_frac, held[(s.reservation, s.gpu_uuid)])
        for s in shares
    ]
