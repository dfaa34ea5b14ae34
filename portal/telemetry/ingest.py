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

from django.db import connection, transaction
from django.utils import timezone

from portal.fleet import links
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node, NodeStatus
from portal.reservations.models import Allocation
from wire import agent_portal as protocol
from wire.agent_portal import Hello, Sample, Samples

from . import conf
from .models import AgentStream, GpuSample, LateMinute, ShareSample

log = logging.getLogger(__name__)

# A GPU that only the agent knows of: recorded, but no share is placed on it until approved.
AWAITING_APPROVAL = "reported by the node's agent, not in the inventory: approve by uncordoning"
# A node holds no more GPUs than one hello may list: hellos with ever new UUIDs add no more.
MAX_GPUS_PER_NODE = protocol.MAX_GPUS_PER_NODE

# A minute is rolled up this long after it ends (portal.telemetry.rollups uses the same value).
ROLLUP_SETTLE = timedelta(seconds=15)
# Writing last_seen once per batch would be one UPDATE per node per second for nothing.
LAST_SEEN_EVERY_S = 5.0


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
class Submission:
    info: StreamInfo
    message: Samples


@dataclass
class Stored:
    """The outcome for one submission: what to ack and the newest reading for the live views."""

    ack_seq: int
    new_samples: int
    latest: dict | None = None  # see _latest_reading


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
        gpu_ids = reconcile_gpus(node, hello)
        status = Node.objects.filter(pk=node.pk).values_list("status", flat=True).first()
        Node.objects.filter(pk=node.pk).update(last_seen=now)
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


def reconcile_gpus(node: Node, hello: Hello) -> dict[str, int]:
    """Trust the agent over the inventory for which of the node's GPUs are there: a GPU it no
    longer reports is flagged unhealthy (no new placements), one it reports again is healthy
    again. A GPU the inventory does not have is added cordoned, awaiting a site admin: an
    agent's word (its token may be stolen) must not create capacity that reservations are
    placed on. Model names stay as reported/seeded: reservations ask for them by those names."""
    reported = {g.uuid: g for g in hello.gpus}
    known = {g.uuid: g for g in Gpu.objects.filter(node=node).only("pk", "uuid", "index", "healthy")}
    changed = False
    for uuid_, gpu in known.items():
        healthy = uuid_ in reported
        if gpu.healthy != healthy:
            Gpu.objects.filter(pk=gpu.pk).update(healthy=healthy)
            changed = True
    ids = {uuid_: gpu.pk for uuid_, gpu in known.items() if uuid_ in reported}
    taken = {g.index for g in known.values()}
    for uuid_, info in reported.items():
        if uuid_ in known:
            continue
        if info.index in taken or len(taken) >= MAX_GPUS_PER_NODE or Gpu.objects.filter(uuid=uuid_).exists():
            log.warning("node %s: the agent reports GPU %s (index %s), refused: its index or UUID is "
                        "taken, or the node has %s GPUs already", node.name, uuid_, info.index, len(taken))
            continue
        ids[uuid_] = Gpu.objects.create(
            node=node, uuid=uuid_, index=info.index, model=info.model[:64], memory_mib=info.memory_mib,
            nvlink_peers=list(info.nvlink_peers), numa_node=info.numa_node,
            cordoned=True, cordon_reason=AWAITING_APPROVAL).pk
        taken.add(info.index)
        log.warning("node %s: new GPU %s (%s) reported by its agent, cordoned until a site admin approves it",
                    node.name, uuid_, info.model[:64])
    if changed:
        fleet_services.gpus_changed(node)
    return ids


def _ts(sample: Sample) -> datetime:
    return datetime.fromtimestamp(sample.ts_ms / 1000, tz=UTC)


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


def _live_shares(submissions: list[Submission]) -> dict[tuple[int, int], int]:
    """(reservation, GPU) → team, for the shares these batches name that hold a live allocation
    on that GPU. The GPU ids come from each connection's own node, so a reading for a share on
    another node, or on a GPU its reservation does not hold, or after release, finds nothing."""
    reservations: set[int] = set()
    gpus: set[int] = set()
    for sub in submissions:
        for sample in sub.message.samples:
            for reservation, gpu_uuid, *_ in _share_readings(sample):
                rid, gid = _reservation_id(reservation), sub.info.gpu_ids.get(gpu_uuid)
                if rid is not None and gid is not None:
                    reservations.add(rid)
                    gpus.add(gid)
    if not reservations:
        return {}
    rows = Allocation.objects.filter(reservation_id__in=reservations, gpu_id__in=gpus, released_at__isnull=True) \
        .values_list("reservation_id", "gpu_id", "reservation__team_id")
    return {(rid, gid): team for rid, gid, team in rows}


def rollup_horizon(now: datetime) -> datetime:
    """Minutes before this may already be rolled up (the rollup leaves the last SETTLE alone).
    Samples of such minutes are marked late, whatever the rollup has done so far: reading its
    progress instead would race with a rollup running at the same moment."""
    return (now - ROLLUP_SETTLE).replace(second=0, microsecond=0)


def store_batches(submissions: list[Submission]) -> list[Stored]:
    """Store the samples of many connections in one transaction; one Stored per submission."""
    shares = _live_shares(submissions)
    horizon = rollup_horizon(timezone.now())
    results: list[Stored] = []
    gpu_rows: list[tuple] = []
    share_rows: list[tuple] = []
    late: set[datetime] = set()
    with transaction.atomic():
        stream_pks = sorted({s.info.stream_pk for s in submissions})
        # Locked in id order: concurrent writers (two portal processes) never deadlock. Plain
        # values, not model instances: hundreds of streams per commit.
        streams = {pk: _StreamState(last_seq, dropped) for pk, last_seq, dropped in
                   AgentStream.objects.select_for_update().filter(pk__in=stream_pks).order_by("pk")
                   .values_list("pk", "last_seq", "dropped")}
        for sub in submissions:
            stream = streams[sub.info.stream_pk]
            fresh = [s for s in sub.message.samples if s.seq > stream.last_seq]
            last = sub.message.samples[-1].seq
            if not fresh:
                results.append(Stored(ack_seq=last, new_samples=0))
                continue
            gpu_ids = sub.info.gpu_ids
            for sample in fresh:
                ts = _ts(sample)
                if ts < horizon:
                    late.add(ts.replace(second=0, microsecond=0))
                for g in sample.gpus:
                    gpu_id = gpu_ids.get(g.uuid)
                    if gpu_id is None:
                        continue  # not a GPU of this node's hello
                    gpu_rows.append((gpu_id, sub.info.stream_pk, sample.seq, ts, g.sm_util_pct, g.mem_util_pct,
                                     g.mem_used_mib, g.power_w, g.temp_c))
                for reservation, gpu_uuid, used, mem in _share_readings(sample):
                    key = (_reservation_id(reservation), gpu_ids.get(gpu_uuid))
                    if key not in shares:
                        continue  # not a live share on this node's GPU (finished, elsewhere, unknown)
                    share_rows.append((*key, ts, used, mem))
            stream.last_seq = fresh[-1].seq
            stream.dropped = max(stream.dropped, sub.message.dropped)
            stream.last_sample_at = _ts(fresh[-1])
            stream.changed = True
            results.append(Stored(ack_seq=last, new_samples=len(fresh),
                                  latest=_latest_reading(sub.info, fresh[-1], shares)))
        _insert(GpuSample, _GPU_COLUMNS, gpu_rows)
        _insert(ShareSample, _SHARE_COLUMNS, share_rows)
        _update_streams({pk: stream for pk, stream in streams.items() if stream.changed})
        if late:
            LateMinute.objects.bulk_create([LateMinute(minute=m) for m in late], ignore_conflicts=True)
        _touch_nodes({s.info.node_id for s in submissions})
    return results


_GPU_COLUMNS = ("gpu_id", "stream_id", "seq", "ts", "sm_util_pct", "mem_util_pct", "mem_used_mib", "power_w",
                "temp_c")
_SHARE_COLUMNS = ("reservation_id", "gpu_id", "ts", "used_frac", "mem_used_mib")


def _insert(model, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """Insert raw rows: PostgreSQL's COPY (several times cheaper per row than INSERT built by the
    ORM, which matters at thousands of rows a second); bulk_create elsewhere (SQLite quickstart)."""
    if not rows:
        return
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(model._meta.db_table)
        names = ", ".join(connection.ops.quote_name(c) for c in columns)
        with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    else:
        model.objects.bulk_create([model(**dict(zip(columns, row, strict=True))) for row in rows],
                                  batch_size=500)


@dataclass
class _StreamState:
    """A locked stream row while its batches are stored."""

    last_seq: int
    dropped: int
    last_sample_at: datetime | None = None
    changed: bool = False


def _update_streams(streams: dict[int, _StreamState]) -> None:
    if not streams:
        return
    # bulk_update builds one CASE per column in Python, slower than the rows it writes.
    # PostgreSQL: one statement over arrays (one round trip, one plan for hundreds of rows);
    # elsewhere executemany of one prepared statement.
    table = connection.ops.quote_name(AgentStream._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"UPDATE {table} AS s SET last_seq = v.last_seq, dropped = v.dropped, "  # noqa: S608 (our table name)
                "last_sample_at = v.last_sample_at FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], "
                "%s::timestamptz[]) AS v(id, last_seq, dropped, last_sample_at) WHERE s.id = v.id",
                [list(streams), [s.last_seq for s in streams.values()], [s.dropped for s in streams.values()],
                 [s.last_sample_at for s in streams.values()]])
        else:
            cursor.executemany(
                f"UPDATE {table} SET last_seq = %s, dropped = %s, last_sample_at = %s WHERE id = %s",  # noqa: S608 (our table name)
                [(s.last_seq, s.dropped, s.last_sample_at, pk) for pk, s in streams.items()])


def _touch_nodes(node_ids: set[int]) -> None:
    now_mono = time.monotonic()
    with _cache.lock:
        due = [n for n in node_ids if now_mono - _cache.last_seen_written.get(n, 0.0) >= LAST_SEEN_EVERY_S]
        for n in due:
            _cache.last_seen_written[n] = now_mono
    if due:
        fleet_services.record_seen(due, timezone.now())


def _latest_reading(info: StreamInfo, sample: Sample, live: dict[tuple[int, int], int]) -> dict:
    """The newest sample of a batch in the shape the live views send (ids, not UUIDs)."""
    gpus = []
    for g in sample.gpus:
        gpu_id = info.gpu_ids.get(g.uuid)
        if gpu_id is not None:
            gpus.append({"gpu": gpu_id, "sm_util_pct": g.sm_util_pct, "mem_util_pct": g.mem_util_pct,
                         "mem_used_mib": g.mem_used_mib, "power_w": g.power_w, "temp_c": g.temp_c})
    shares = []
    for reservation, gpu_uuid, used, mem in _share_readings(sample):
        key = (_reservation_id(reservation), info.gpu_ids.get(gpu_uuid))
        if key not in live:
            continue
        shares.append({"reservation": key[0], "team": live[key], "gpu": key[1],
                       "used_frac": round(used, 4), "mem_used_mib": mem})
    return {"node": info.node_id, "ts_ms": sample.ts_ms, "gpus": gpus, "shares": shares}


def too_far_ahead(message: Samples, now: datetime | None = None, skew: timedelta | None = None) -> str | None:
    """Why a batch is refused for its clock, or None. (The protocol lets the portal tighten ts.)"""
    skew = skew or conf.max_future_skew()
    limit = (now or timezone.now()) + skew
    for i, sample in enumerate(message.samples):
        if _ts(sample) > limit:
            return (f"samples: samples[{i}].ts_ms: {sample.ts_ms} is more than {int(skew.total_seconds())} s "
                    "in the future (check the node's clock)")
    return None
