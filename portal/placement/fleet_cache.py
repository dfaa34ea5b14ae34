"""The fleet part of the placement snapshot (nodes and their GPUs, without shares), kept per
process while the node and GPU rows are unchanged.

Every cycle and every capacity preview used to read and rebuild all of it: at 500 nodes × 8 GPUs
about 60 ms of Python per call (4,000 rows, a JSON decode of each GPU's NVLink peers, 4,000
engine objects), while these rows change only when an admin or an agent changes the fleet.
PostgreSQL tells whether they changed: statement triggers on the node and GPU tables bump a
version number (fleet migration 0007) in the same transaction as any insert, delete, or update of a
column the snapshot reads, so the answer stays exact: no age, no invalidation to forget at one of
the fleet's many writers (admin, inventory, agent hello, drain, cordon, an `.update()` behind the
services). Columns outside the snapshot (`last_seen`, written by every agent's heartbeat) do not
bump it. Without PostgreSQL every call reads the rows.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from django.db import connection

from portal import db_vendor
from portal.fleet.models import Gpu, Node
from scheduler import core

VERSION_SQL = "SELECT version FROM fleet_fleetversion WHERE id = 1"


class FleetNode(NamedTuple):
    pk: int
    name: str
    labels: dict
    status: str
    cpu_milli: int  # allocatable (0: unknown)
    memory_mib: int
    gpu_pks: tuple[int, ...]  # in the order of `blank.gpus`
    blank: core.Node  # the node with no shares and no pods on it


class Fleet(NamedTuple):
    nodes: tuple[FleetNode, ...]
    layout: core.FleetLayout  # the engine's layout of the blank nodes, worked out once per fleet
    blanks: tuple[core.Node, ...]  # each node's `blank`, in the order of `nodes`
    # Names → database ids, for committing what the engine chose by name (every node; the GPUs
    # the snapshot holds), and where each of those GPUs and nodes sits in `nodes`.
    node_ids: dict[str, int]
    gpu_ids: dict[str, int]
    position_of_node: dict[int, int]  # node pk → index in `nodes`
    position_of_gpu: dict[int, int]  # GPU pk → index of its node in `nodes`


_lock = threading.Lock()
_cached: tuple[tuple, Fleet] | None = None


def version() -> tuple | None:
    """The fleet's version as this connection sees it (None without PostgreSQL: no version)."""
    return db_vendor.of(connection).versioned_row(connection, VERSION_SQL)


def _read() -> Fleet:
    gpus_of: dict[int, list[tuple]] = {}
    # Cordoned GPUs take no new shares: absent from the snapshot, like unhealthy ones.
    for row in Gpu.objects.filter(healthy=True, cordoned=False).order_by("node_id", "index").values_list(
            "pk", "node_id", "uuid", "index", "model", "memory_mib", "nvlink_peers", "numa_node"):
        gpus_of.setdefault(row[1], []).append(row)
    nodes = []
    for pk, name, labels, status, cpu, memory in Node.objects.order_by("name").values_list(
            "pk", "name", "labels", "status", "cpu_milli", "memory_mib"):
        gpus = gpus_of.get(pk, [])
        by_uuid = {g[2]: g[3] for g in gpus}
        blank = core.Node(
            name=name, labels=dict(labels), status=core.NodeStatus(status),
            cpu_milli_free=cpu or None, memory_mib_free=memory or None,  # no pods: all of it (0: untracked)
            gpus=tuple(
                core.Gpu(uuid=uuid, index=index, model=model, memory_mib=mem,
                         nvlink_peers=frozenset(by_uuid[p] if isinstance(p, str) else p
                                                for p in peers if not isinstance(p, str) or p in by_uuid),
                         numa_node=numa or 0)
                for _pk, _node, uuid, index, model, mem, peers, numa in gpus))
        nodes.append(FleetNode(pk, name, labels, status, cpu, memory, tuple(g[0] for g in gpus), blank))
    blanks = tuple(n.blank for n in nodes)
    return Fleet(
        tuple(nodes), core.FleetLayout(list(blanks)), blanks,
        node_ids={n.name: n.pk for n in nodes},
        gpu_ids={gpu.uuid: pk for n in nodes for pk, gpu in zip(n.gpu_pks, n.blank.gpus, strict=True)},
        position_of_node={n.pk: i for i, n in enumerate(nodes)},
        position_of_gpu={pk: i for i, n in enumerate(nodes) for pk in n.gpu_pks})


def fleet() -> Fleet:
    """The fleet's nodes by name, each with its healthy, uncordoned GPUs by index, as the rows
    are now (as this connection sees them), and their layout for the engine."""
    global _cached
    seen = version()
    if seen is not None:
        with _lock:
            if _cached is not None and _cached[0] == seen:
                return _cached[1]
    now = _read()
    if seen is not None:
        with _lock:
            _cached = (seen, now)
    return now
