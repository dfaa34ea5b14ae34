"""Storing what agents send: the hello (stream, GPU inventory, the node's CPU and memory, node
seen) and sample batches.

`store_batches` takes the batches of many connections at once and writes them in one
transaction: at 500 nodes × 1 Hz, one commit per batch would cost more than the rows themselves.
Idempotency is per (node, stream, seq): the stream row is locked, samples with seq ≤ its
`last_seq` are skipped, and `last_seq` moves forward in the same transaction as the rows.

An agent speaks only for its own node: a share reading is stored only for a reservation that
holds a live allocation on that GPU of that node (not another node's, not a finished one), and
its hello cannot add capacity — a GPU that is not in the node's inventory is recorded cordoned,
awaiting a site admin's approval (uncordon), and nothing is placed on it before that.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from portal.fleet import links
from portal.fleet import services as fleet_services
from portal.fleet.models import Node, NodeStatus
from wire.agent_portal import Hello, Sample, Samples

from . import conf
from .live import Latest
from .models import AgentStream, LateMinute
from .sample_rows import SampleRows, live_allocations, lock_streams, update_streams

log = logging.getLogger(__name__)

# A minute is rolled up this long after it ends (portal.telemetry.rollups uses the same value).
ROLLUP_SETTLE = timedelta(seconds=15)
# Writing last_seen once per batch would be one UPDATE per node per second for nothing.
LAST_SEEN_EVERY_S = 5.0
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class StreamInfo:
    """What a connection learnt at hello and needs for every batch."""

    stream_pk: int
    node_id: int
    node_name: str
    acked_seq: int
    gpu_ids: dict[str, int]  # GPU UUID → Gpu pk, for the GPUs of this node
    # The GPU nodes' servers its agent should probe (welcome.remote_servers); None: not for this agent.
    remote_servers: list[dict[str, str]] | None = None


@dataclass
class Stored:
    """The outcome for one submission: what to ack and the newest reading for the live views."""

    ack_seq: int
    new_samples: int
    latest: Latest | None = None


@dataclass
class _Cache:
    last_seen_written: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_cache = _Cache()


def forget_cache() -> None:
    """Drop what this process remembers about reservations and nodes (tests; after a failed commit)."""
    with _cache.lock:
        _cache.last_seen_written.clear()


def register_hello(node: Node, hello: Hello) -> StreamInfo:
    """Record the agent's stream and GPUs, mark the node seen (and back from lost)."""
    now = timezone.now()
    stream_id = uuid.UUID(hello.stream)
    with transaction.atomic():
        stream = AgentStream.objects.filter(node=node, stream=stream_id).first()
        if stream is None:
            stream, _ = AgentStream.objects.get_or_create(
                node=node, stream=stream_id,
                defaults={"agent_version": hello.agent_version, "source": hello.source,
                          "interval_ms": hello.interval_ms},
            )
        gpu_ids = fleet_services.reconcile_gpus(node, hello.gpus)
        status = Node.objects.filter(pk=node.pk).values_list("status", flat=True).first()
        fleet_services.record_seen([node.pk], now)
    if status == NodeStatus.LOST:
        fleet_services.mark_back(node.pk)
    if hello.resources is not None:  # bounded by the protocol; a node says only its own
        fleet_services.record_resources(node.pk, hello.resources.cpu_milli, hello.resources.memory_mib)
    with _cache.lock:
        _cache.last_seen_written[node.pk] = time.monotonic()
    # Agents that report the node's resources measure links too (and know the welcome's field).
    servers = links.remote_servers_for(node) if hello.resources is not None else None
    return StreamInfo(stream_pk=stream.pk, node_id=node.pk, node_name=node.name,
                      acked_seq=stream.last_seq, gpu_ids=gpu_ids, remote_servers=servers)


def ts_of(ts_ms: int) -> datetime:
    """A sample's time (exact: integer milliseconds, no float division)."""
    return EPOCH + timedelta(milliseconds=ts_ms)


def _ms(at: datetime) -> int:
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


def _live_shares(submissions: list[Submission]) -> dict[tuple[int, int], int]:
    """(reservation, GPU) → team, for the shares these batches name that hold a live allocation
    on that GPU. The GPU ids come from each connection's own node, so a reading for a share on
    another node, or on a GPU its reservation does not hold, or after release, finds nothing."""
    reservations: set[int] = set()
    gpus: set[int] = set()
    for sub in submissions:
        for reading in sub.readings:
            for rid, gid, _, _ in reading.shares:
                reservations.add(rid)
                gpus.add(gid)
    if not reservations:
        return {}
    return live_allocations(reservations, gpus)


def rollup_horizon(now: datetime) -> datetime:
    """Minutes before this may already be rolled up (the rollup leaves the last SETTLE alone).
    Samples of such minutes are marked late, whatever the rollup has done so far: reading its
    progress instead would race with a rollup running at the same moment."""
    return (now - ROLLUP_SETTLE).replace(second=0, microsecond=0)


def store_batches(submissions: list[Submission]) -> list[Stored]:
    """Store the samples of many connections in one transaction; one Stored per submission."""
    shares = _live_shares(submissions)
    horizon_ms = _ms(rollup_horizon(timezone.now()))
    results: list[Stored] = []
    rows = SampleRows()
    late: set[int] = set()
    with transaction.atomic():
        streams = lock_streams(list({s.info.stream_pk for s in submissions}))
        for sub in submissions:
            stream = streams[sub.info.stream_pk]
            last = sub.readings[-1].seq
            if last <= stream.last_seq:
                results.append(Stored(ack_seq=last, new_samples=0))
                continue
            # Consecutive seqs (the protocol): what is new is the end of the batch.
            fresh = [r for r in sub.readings if r.seq > stream.last_seq]
            for reading in fresh:
                ts = ts_of(reading.ts_ms)
                if reading.ts_ms < horizon_ms:
                    late.add(reading.ts_ms - reading.ts_ms % 60_000)
                # Only live shares on this node's GPUs (not finished, not elsewhere, not unknown).
                rows.add(sub.info.stream_pk, reading.seq, ts, reading.gpus,
                         [s for s in reading.shares if (s[0], s[1]) in shares])
            stream.last_seq = last
            stream.dropped = max(stream.dropped, sub.dropped)
            stream.last_sample_at = ts
            stream.changed = True
            results.append(Stored(ack_seq=last, new_samples=len(fresh), latest=_latest(sub.info, fresh[-1], shares)))
        rows.write()
        update_streams({pk: stream for pk, stream in streams.items() if stream.changed})
        if late:
            LateMinute.objects.bulk_create([LateMinute(minute=ts_of(m)) for m in late], ignore_conflicts=True)
        _touch_nodes({s.info.node_id for s in submissions})
    return results


def _touch_nodes(node_ids: set[int]) -> None:
    now_mono = time.monotonic()
    with _cache.lock:
        due = [n for n in node_ids if now_mono - _cache.last_seen_written.get(n, 0.0) >= LAST_SEEN_EVERY_S]
        for n in due:
            _cache.last_seen_written[n] = now_mono
    if due:
        fleet_services.record_seen(due, timezone.now())


def _latest(info: StreamInfo, reading: Reading, live: dict[tuple[int, int], int]) -> Latest:
    """The newest reading of a batch for the live views: its GPUs, and its live shares with their team."""
    shares = [(rid, live[(rid, gid)], gid, used, mem) for rid, gid, used, mem in reading.shares if (rid, gid) in live]
    return Latest(node=info.node_id, ts_ms=reading.ts_ms, gpus=reading.gpus, shares=shares)


def too_far_ahead(message: Samples, now: datetime | None = None, skew: timedelta | None = None) -> str | None:
    """Why a batch is refused for its clock, or None. (The protocol lets the portal tighten ts.)"""
    skew = skew or conf.max_future_skew()
    limit = (now or timezone.now()) + skew
    limit_ms = _ms(limit)  # whole milliseconds: a ts_ms equal to the limit's is not beyond it
    for i, sample in enumerate(message.samples):
        if sample.ts_ms > limit_ms:
            return (f"samples: samples[{i}].ts_ms: {sample.ts_ms} is more than {int(skew.total_seconds())} s "
                    "in the future (check the node's clock)")
    return None
