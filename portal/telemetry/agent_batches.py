"""A batch of samples as the agent's connection reduces it before it waits for the commit: this
node's own GPUs by id, share readings naming a reservation and a GPU that can be live on this
node, and the check of the batch's clock. The writer then only filters and stores (ingest.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from wire.agent_portal import Sample, Samples

from . import conf
from .streams import StreamInfo

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts_of(ts_ms: int) -> datetime:
    """A sample's time (exact: integer milliseconds, no float division)."""
    return EPOCH + timedelta(milliseconds=ts_ms)


def ms_of(at: datetime) -> int:
    return (at - EPOCH) // timedelta(milliseconds=1)


def _share_readings(sample: Sample) -> list[tuple[str, str, float, int | None]]:
    """(reservation, gpu uuid, used fraction, memory) per share. Without a share broker the
    agent reports processes only; their SM use, summed per reservation, stands in."""
    if sample.shares:
        return [(s.reservation, s.gpu_uuid, s.used_frac, s.mem_used_mib) for s in sample.shares]
    derived: dict[tuple[str, str], list] = {}
    for p in sample.processes:
        if p.reservation is None:
            continue
        entry = derived.setdefault((p.reservation, p.gpu_uuid), [0.0, None])
        entry[0] += (p.sm_util_pct or 0) / 100
        if p.mem_used_mib is not None:
            entry[1] = (entry[1] or 0) + p.mem_used_mib
    return [(r, g, min(1.0, used), mem) for (r, g), (used, mem) in derived.items()]


_RESERVATION_ID = re.compile(r"[0-9]{1,18}")


def _reservation_id(text: str) -> int | None:
    """The reservation a reading names, or None (ASCII digits only: '²'.isdigit() is true too)."""
    return int(text) if _RESERVATION_ID.fullmatch(text) else None


@dataclass(frozen=True, slots=True)
class Reading:
    """One sample reduced to what may be stored: ids and values, no UUIDs (see reduce)."""

    seq: int
    ts_ms: int
    gpus: list[tuple]  # (gpu id, sm_util_pct, mem_util_pct, mem_used_mib, power_w, temp_c): this node's GPUs
    shares: list[tuple]  # (reservation id, gpu id, used_frac, mem_used_mib): ids that exist on this node


@dataclass(frozen=True, slots=True)
class Submission:
    """A valid batch, reduced by the consumer before it waits for the commit (reduce): the writer
    thread, which every connection of the process shares, then only filters and writes."""

    info: StreamInfo
    dropped: int
    readings: list[Reading]


def reduce(info: StreamInfo, message: Samples) -> Submission:
    """The batch's readings of this node's own GPUs (a GPU not in its hello is dropped), and its
    share readings whose reservation and GPU name something that can be live on this node
    (store_batches keeps those that hold a live allocation at the commit)."""
    gpu_ids = info.gpu_ids
    readings = []
    for sample in message.samples:
        gpus = [(gpu_ids[g.uuid], g.sm_util_pct, g.mem_util_pct, g.mem_used_mib, g.power_w, g.temp_c)
                for g in sample.gpus if g.uuid in gpu_ids]
        shares = []
        for reservation, gpu_uuid, used, mem in _share_readings(sample):
            rid, gid = _reservation_id(reservation), gpu_ids.get(gpu_uuid)
            if rid is not None and gid is not None:
                shares.append((rid, gid, used, mem))
        readings.append(Reading(sample.seq, sample.ts_ms, gpus, shares))
    return Submission(info, message.dropped, readings)


def too_far_ahead(message: Samples, now: datetime | None = None, skew: timedelta | None = None) -> str | None:
    """Why a batch is refused for its clock, or None. (The protocol lets the portal tighten ts.)"""
    skew = skew or conf.max_future_skew()
    limit = (now or timezone.now()) + skew
    limit_ms = ms_of(limit)  # whole milliseconds: a ts_ms equal to the limit's is not beyond it
    for i, sample in enumerate(message.samples):
        if sample.ts_ms > limit_ms:
            return (f"samples: samples[{i}].ts_ms: {sample.ts_ms} is more than {int(skew.total_seconds())} s "
                    "in the future (check the node's clock)")
    return None
