"""The SQL of storing sample batches: locking the streams, reading the live shares they name,
writing raw rows, moving the streams on.

At 500 batches a second, the ORM's per-value preparation of `IN` lists and psycopg's per-value
dumping (`write_row`) cost more CPU than everything else the live process does for a batch. So
the two reads are compiled once (portal.precompiled: one array parameter on PostgreSQL), the
streams move on in one statement over text arrays (portal.db_vendor), and where the database takes COPY (PostgreSQL,
portal.db_vendor) the raw rows go as one block of COPY text per commit; elsewhere (the SQLite
quickstart) through the ORM.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from portal import db_vendor
from portal.precompiled import Precompiled, param_in
from portal.reservations.models import Allocation

from .models import AgentStream, GpuSample, ShareSample

# COPY text format: tab between columns, newline after each row, NULL as \N. Every value written
# here is an integer or a float that the wire protocol validated (finite), None, or a timestamp
# formatted by datetime.isoformat(): no value holds a tab, newline or backslash, so nothing needs
# escaping. str() of a float is the shortest text PostgreSQL reads back as the same double.
NULL = "\\N"
_GPU_COLUMNS = ("stream_id", "seq", "ts", "gpu_id", "sm_util_pct", "mem_util_pct", "mem_used_mib", "power_w",
                "temp_c")
_SHARE_COLUMNS = ("reservation_id", "gpu_id", "ts", "used_frac", "mem_used_mib")


@dataclass
class StreamState:
    """A locked stream row while its batches are stored."""

    last_seq: int
    dropped: int
    last_sample_at: datetime | None = None
    changed: bool = False


_LOCK_STREAMS = Precompiled(lambda: AgentStream.objects.select_for_update().filter(param_in("pk", "ids"))
                            .order_by("pk").values_list("pk", "last_seq", "dropped"))
_LIVE_ALLOCATIONS = Precompiled(lambda: Allocation.objects.filter(
    param_in("reservation_id", "reservations"), param_in("gpu_id", "gpus"), released_at__isnull=True)
    .order_by().values_list("reservation_id", "gpu_id", "reservation__team_id"))


def lock_streams(stream_pks: list[int]) -> dict[int, StreamState]:
    """Lock the streams, in id order (two writers never deadlock), and read their positions."""
    return {pk: StreamState(last_seq, dropped) for pk, last_seq, dropped in _LOCK_STREAMS.all(ids=list(stream_pks))}


def live_allocations(reservations: set[int], gpus: set[int]) -> dict[tuple[int, int], int]:
    """(reservation, GPU) → team of the live allocations among these reservations and GPUs."""
    return {(rid, gid): team for rid, gid, team in
            _LIVE_ALLOCATIONS.all(reservations=list(reservations), gpus=list(gpus))}


def update_streams(streams: dict[int, StreamState]) -> None:
    if not streams:
        return
    # bulk_update builds one CASE per column in Python, slower than the rows it writes.
    db_vendor.of(connection).update_by_id(
        connection, AgentStream._meta.db_table,
        [("last_seq", "bigint"), ("dropped", "bigint"), ("last_sample_at", "timestamptz")],
        [(pk, s.last_seq, s.dropped, s.last_sample_at) for pk, s in streams.items()])


class SampleRows:
    """The raw rows of one commit, collected and then written at once (write)."""

    def __init__(self) -> None:
        self._vendor = db_vendor.of(connection)
        self._copy = self._vendor.copies_text
        self._gpus: list[str] | list[GpuSample] = []
        self._shares: list[str] | list[ShareSample] = []

    def add(self, stream_pk: int, seq: int, ts: datetime, gpus: list[tuple], shares: list[tuple]) -> None:
        """One sample's rows: its GPU readings (gpu id, sm_util_pct, mem_util_pct, mem_used_mib,
        power_w, temp_c) and share readings (reservation id, gpu id, used_frac, mem_used_mib)."""
        if not self._copy:
            self._gpus += [GpuSample(stream_id=stream_pk, seq=seq, ts=ts, gpu_id=g, sm_util_pct=sm, mem_util_pct=mu,
                                     mem_used_mib=mem, power_w=pw, temp_c=tc) for g, sm, mu, mem, pw, tc in gpus]
            self._shares += [ShareSample(reservation_id=r, gpu_id=g, ts=ts, used_frac=used, mem_used_mib=mem)
                             for r, g, used, mem in shares]
            return
        ts_text = ts.isoformat()
        head = f"{stream_pk}\t{seq}\t{ts_text}\t"
        self._gpus += [
            f"{head}{g}\t{NULL if sm is None else sm}\t{NULL if mu is None else mu}\t{mem}\t"
            f"{NULL if pw is None else pw}\t{NULL if tc is None else tc}\n"
            for g, sm, mu, mem, pw, tc in gpus
        ]
        self._shares += [f"{r}\t{g}\t{ts_text}\t{used}\t{NULL if mem is None else mem}\n"
                         for r, g, used, mem in shares]

    def write(self) -> None:
        tables = ((GpuSample, _GPU_COLUMNS, self._gpus), (ShareSample, _SHARE_COLUMNS, self._shares))
        for model, columns, rows in tables:
            if not rows:
                continue
            if self._copy:
                self._vendor.copy_text(connection, model._meta.db_table, columns, "".join(rows))
            else:
                model.objects.bulk_create(rows, batch_size=500)
