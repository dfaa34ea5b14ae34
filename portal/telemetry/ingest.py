"""Storing the agents' sample batches (reduced by agent_batches.py) and marking their nodes seen.

`store_batches` takes the batches of many connections at once and writes them in one
transaction: at 500 nodes × 1 Hz, one commit per batch would cost more than the rows themselves.
Idempotency is per (node, stream, seq): the stream row is locked, samples with seq ≤ its
`last_seq` are skipped, and `last_seq` moves forward in the same transaction as the rows.

An agent speaks only for its own node: a share reading is stored only for a reservation that
holds a live allocation on that GPU of that node (not another node's, not a finished one), and
its hello (streams.py) cannot add capacity — a GPU that is not in the node's inventory is recorded
cordoned, awaiting a site admin's approval (uncordon), and nothing is placed on it before that.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from . import seen
from .agent_batches import Reading, Submission, ms_of, ts_of
from .live import Latest
from .models import LateMinute
from .sample_rows import SampleRows, live_allocations, lock_streams, update_streams
from .streams import StreamInfo

# A minute is rolled up this long after it ends (portal.telemetry.rollups uses the same value).
ROLLUP_SETTLE = timedelta(seconds=15)


@dataclass
class Stored:
    """The outcome for one submission: what to ack and the newest reading for the live views."""

    ack_seq: int
    new_samples: int
    latest: Latest | None = None


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
    horizon_ms = ms_of(rollup_horizon(timezone.now()))
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
        seen.touch({s.info.node_id for s in submissions})
    return results


def _latest(info: StreamInfo, reading: Reading, live: dict[tuple[int, int], int]) -> Latest:
    """The newest reading of a batch for the live views: its GPUs, and its live shares with their team."""
    shares = [(rid, live[(rid, gid)], gid, used, mem) for rid, gid, used, mem in reading.shares if (rid, gid) in live]
    return Latest(node=info.node_id, ts_ms=reading.ts_ms, gpus=reading.gpus, shares=shares)
