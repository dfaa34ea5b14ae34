"""ClusterState: the cycle's mutable working copy of a snapshot, held as numpy arrays.

Nodes are rows, GPU slots are columns (padded to the widest node; a padded slot has 0 free milli
and is marked invalid, so it never fits a request). Every change to a node bumps its version, which
lets scorers keep per-node results and recompute only what changed.

The shares' labels are kept per GPU as they come and go (`GpuLabels`) and indexed for the label
filters: each GPU's exclusion group as an array, and per affinity and anti-affinity label the GPUs
that hold it. A filter is then a few array operations, not a walk over every GPU holding a share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .model import MILLI, Node, NodeStatus, Request, Share, Snapshot, to_milli

UNTRACKED = np.int64(1 << 60)  # node CPU/memory nobody reported: never a reason to refuse
# ClusterState.exclusion per GPU: no share on it, or shares of several exclusion groups; else the
# id of the one group all its shares carry (ClusterState.exclusion_id; 0: no exclusion label).
NO_SHARES, MIXED, UNLABELLED = -1, -2, 0


@dataclass
class GpuLabels:
    """Labels of the shares on one GPU, counted so that a share leaving removes exactly its own."""

    affinity: Counter[str] = field(default_factory=Counter)
    anti_affinity: Counter[str] = field(default_factory=Counter)
    exclusion: Counter[frozenset[str]] = field(default_factory=Counter)
    shares: int = 0

    def add(self, share: Share, sign: int = 1) -> None:
        for label in share.affinity:
            self.affinity[label] += sign
        for label in share.anti_affinity:
            self.anti_affinity[label] += sign
        self.exclusion[share.exclusion] += sign
        self.shares += sign
        for counter in (self.affinity, self.anti_affinity, self.exclusion):
            for key in [k for k, v in counter.items() if v <= 0]:
                del counter[key]


@dataclass(frozen=True)
class Holding:
    """What a share took, so that it can be given back (rollback, preemption), and `order`, when it
    was first placed in this state (a count): ties between equal victims go to the lower. A
    rolled-back preemption restores the same Holding, so a rollback never changes that order."""

    share: Share
    node: int
    gpus: tuple[int, ...]
    milli: int
    gpu_memory_mib: int
    cpu_milli: int
    node_memory_mib: int
    order: int = 0


class ClusterState:
    def __init__(
        self,
        node_names: Sequence[str],
        gpu_models: Sequence[Sequence[str]],
        gpu_memory_mib: Sequence[Sequence[int]],
        cpu_milli_free: Sequence[int | None] | None = None,
        memory_mib_free: Sequence[int | None] | None = None,
        status: Sequence[NodeStatus] | None = None,
        node_labels: Sequence[Mapping[str, str]] | None = None,
        gpu_uuids: Sequence[Sequence[str]] | None = None,
        gpu_indexes: Sequence[Sequence[int]] | None = None,
        nvlink: Sequence[Sequence[frozenset[int]]] | None = None,
        numa: Sequence[Sequence[int]] | None = None,
        tie_rank: np.ndarray | None = None,
    ) -> None:
        n = len(node_names)
        width = max([len(m) for m in gpu_models] + [1])
        self.node_names = list(node_names)
        self.node_index = {name: i for i, name in enumerate(self.node_names)}
        self.gpu_count = np.array([len(m) for m in gpu_models], dtype=np.int64)
        self.valid = np.arange(width)[None, :] < self.gpu_count[:, None]
        self.models: list[str] = sorted({m for row in gpu_models for m in row})
        self.model_id = {m: i for i, m in enumerate(self.models)}
        self.gpu_model = np.full((n, width), -1, dtype=np.int64)
        self.mem_total = np.zeros((n, width), dtype=np.int64)
        for i, row in enumerate(gpu_models):
            self.gpu_model[i, : len(row)] = [self.model_id[m] for m in row]
            self.mem_total[i, : len(row)] = gpu_memory_mib[i]
        # The node's model for fragmentation: the model of its first GPU (nodes are homogeneous in practice).
        self.node_model = np.where(self.gpu_count > 0, self.gpu_model[:, 0], -1)
        self.homogeneous = all(len(set(row)) <= 1 for row in gpu_models)
        self._model_masks: dict[frozenset[str], np.ndarray] = {}
        self.free = np.where(self.valid, MILLI, 0).astype(np.int64)
        self.mem_free = self.mem_total.copy()
        self.cpu_free = _tracked(cpu_milli_free, n)
        self.node_mem_free = _tracked(memory_mib_free, n)
        statuses = list(status) if status is not None else [NodeStatus.READY] * n
        self.ready = np.array([s == NodeStatus.READY for s in statuses], dtype=bool)
        self.node_labels = list(node_labels) if node_labels is not None else [{} for _ in range(n)]
        self.gpu_uuids = (
            [list(u) for u in gpu_uuids]
            if gpu_uuids is not None
            else [[f"{name}/gpu{j}" for j in range(len(gpu_models[i]))] for i, name in enumerate(node_names)]
        )
        self.gpu_indexes = (
            [list(x) for x in gpu_indexes]
            if gpu_indexes is not None
            else [list(range(len(m))) for m in gpu_models]
        )
        self.nvlink = nvlink
        self.numa = numa
        self.version = np.zeros(n, dtype=np.int64)
        # Ties go to the node that sorts first in this order (a fixed permutation, e.g. per seed).
        self.tie_rank = np.arange(n, dtype=np.int64) if tie_rank is None else np.asarray(tie_rank)
        # Every GPU holding shares has a record; label filters only look when some share is labelled.
        self.labels: dict[tuple[int, int], GpuLabels] = {}
        self.labelled_shares = 0
        self._index_labels()
        self.placed: dict[str, Holding] = {}
        self.placements = 0  # shares placed so far: the next one's Holding.order
        self.on_node: dict[int, dict[str, Holding]] = {}  # per node, its entries of `placed`
        self._index_holders()
        self.reserved_now: set[str] = set()  # reserved by this cycle (not in the snapshot)
        # Never a victim: other schedulers' shares, and booked windows that run (bookings.plan).
        self.protected: set[str] = set()
        self._index_fresh()
        self.group_nodes: dict[str, Counter[int]] = {}
        self.group_held: Counter[str] = Counter()  # pod group -> its shares held (one per request)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> ClusterState:
        layout = snapshot.layout
        if layout is not None and layout.fits(snapshot.nodes):
            return layout.state_of(snapshot.nodes)
        nodes: tuple[Node, ...] = snapshot.nodes
        ordered = [sorted(node.gpus, key=lambda g: g.index) for node in nodes]
        state = cls(
            node_names=[n.name for n in nodes],
            gpu_models=[[g.model for g in gpus] for gpus in ordered],
            gpu_memory_mib=[[g.memory_mib for g in gpus] for gpus in ordered],
            cpu_milli_free=[n.cpu_milli_free for n in nodes],
            memory_mib_free=[n.memory_mib_free for n in nodes],
            status=[n.status for n in nodes],
            node_labels=[dict(n.labels) for n in nodes],
            gpu_uuids=[[g.uuid for g in gpus] for gpus in ordered],
            gpu_indexes=[[g.index for g in gpus] for gpus in ordered],
            nvlink=[_peer_slots_of(gpus) for gpus in ordered],
            numa=[[g.numa_node for g in gpus] for gpus in ordered],
        )
        for i, gpus in enumerate(ordered):
            for j, gpu in enumerate(gpus):
                for share in gpu.shares:
                    state._hold_existing(i, j, share)
        return state

    def _index_labels(self) -> None:
        """Empty label indexes (no share holds a label yet)."""
        self.exclusion = np.full(self.free.shape, NO_SHARES, dtype=np.int64)
        self.exclusion_id: dict[frozenset[str], int] = {frozenset(): UNLABELLED}
        self.affinity_at: dict[str, set[tuple[int, int]]] = {}
        self.anti_affinity_at: dict[str, set[tuple[int, int]]] = {}

    def _index_holders(self) -> None:
        """Entries of `placed` by team, admission and priority: the shares a preemption rule can
        take are a few of these (`holdings_of`), so a search need not ask it about every share."""
        self.by_team: dict[str, dict[str, Holding]] = {}
        self.by_admission: dict[str, dict[str, Holding]] = {}
        self.by_priority: dict[int, dict[str, Holding]] = {}

    def _index_fresh(self) -> None:
        """Per GPU, the compute and memory that this cycle's reservations (`reserved_now`) hold; per
        node, the CPU and memory that all holdings (`held_*`) and this cycle's (`fresh_*`) hold (a
        snapshot's shares hold none: the node's free CPU and memory come reported)."""
        self.fresh_milli = np.zeros(self.free.shape, dtype=np.int64)
        self.fresh_mem = np.zeros(self.free.shape, dtype=np.int64)
        n = len(self.free)
        self.held_cpu, self.held_node_mem = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.fresh_cpu, self.fresh_node_mem = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)

    def _hold_existing(self, i: int, j: int, share: Share) -> None:
        # Existing shares were admitted elsewhere; record them even if they over-commit.
        self.free[i, j] -= to_milli(share.gpu_request)
        self.mem_free[i, j] -= share.gpu_memory_mib
        self._relabel(i, j, share, +1)
        rec = self.placed.get(share.reservation_id)
        gpus_of, order = ((*rec.gpus, j), rec.order) if rec else ((j,), self._next_order())
        self._hold(Holding(share, i, gpus_of, to_milli(share.gpu_request), share.gpu_memory_mib, 0, 0, order))
        if share.group:
            self.group_nodes.setdefault(share.group, Counter())[i] += 1

    def _empty_copy(self) -> ClusterState:
        """A copy of this state, which holds nothing: the fixed parts (names, models, UUIDs,
        NVLink) shared, the parts a cycle changes copied."""
        state = object.__new__(ClusterState)
        state.__dict__.update(self.__dict__)
        state.free = self.free.copy()
        state.mem_free = self.mem_free.copy()
        state.version = self.version.copy()
        state.labels, state.labelled_shares, state.placed, state.on_node = {}, 0, {}, {}
        state.placements = 0
        state._index_holders()
        state._index_labels()
        state.reserved_now, state.group_nodes, state.group_held = set(), {}, Counter()
        state.protected = set()
        state._index_fresh()
        return state

    # ---- queries ------------------------------------------------------------------------------
    @property
    def has_labels(self) -> bool:
        """Whether any share in the cluster carries a label (else label filters have nothing to do)."""
        return self.labelled_shares > 0

    def exclusion_labelled(self) -> np.ndarray:
        """GPU slots holding a share with an exclusion label."""
        return (self.exclusion > UNLABELLED) | (self.exclusion == MIXED)

    def holding_exactly(self, exclusion: frozenset[str]) -> np.ndarray:
        """GPU slots with shares, every one of them in exclusion group `exclusion`."""
        gid = self.exclusion_id.get(exclusion)
        if gid is None:
            return np.zeros(self.free.shape, dtype=bool)
        return self.exclusion == gid

    def holding_label(self, at: dict[str, set[tuple[int, int]]], labels: frozenset[str]) -> np.ndarray:
        """GPU slots holding a share with one of `labels` (`at`: affinity_at or anti_affinity_at)."""
        out = np.zeros(self.free.shape, dtype=bool)
        for label in labels:
            gpus = at.get(label)
            if gpus:
                rows, cols = zip(*gpus, strict=True)
                out[list(rows), list(cols)] = True
        return out

    def _relabel(self, i: int, j: int, share: Share, sign: int) -> None:
        """Count `share`'s labels on GPU (i, j) in (sign +1) or out (-1), and update the indexes."""
        key = (i, j)
        labels = self.labels.get(key)
        if labels is None:
            labels = self.labels[key] = GpuLabels()
        labels.add(share, sign)
        self.labelled_shares += sign * _is_labelled(share)
        for label in share.affinity:
            _index(self.affinity_at, label, key, label in labels.affinity)
        for label in share.anti_affinity:
            _index(self.anti_affinity_at, label, key, label in labels.anti_affinity)
        groups = list(labels.exclusion)
        if len(groups) == 1:
            gid = self.exclusion_id.setdefault(groups[0], len(self.exclusion_id))
        else:
            gid = NO_SHARES if not groups else MIXED
        self.exclusion[i, j] = gid
        if labels.shares <= 0:
            del self.labels[key]

    def holdings_of(self, teams: Iterable[str] = (), admissions: Iterable[str] = (),
                    priorities: Iterable[int] = ()) -> dict[str, Holding]:
        """The holdings of a share of one of `teams`, or admitted as one of `admissions`, or of one
        of `priorities`, by reservation id."""
        out: dict[str, Holding] = {}
        for index, keys in ((self.by_team, teams), (self.by_admission, admissions), (self.by_priority, priorities)):
            for key in keys:
                out.update(index.get(key, ()))
        return out

    def model_at(self, node: int, slot: int) -> str:
        """The GPU model of slot `slot` of node `node`."""
        return self.models[int(self.gpu_model[node, slot])]

    def model_mask(self, models: frozenset[str]) -> np.ndarray:
        """GPU slots of one of `models` (cached: models never change)."""
        mask = self._model_masks.get(models)
        if mask is None:
            ids = [self.model_id[m] for m in models if m in self.model_id]
            mask = np.isin(self.gpu_model, ids)
            self._model_masks[models] = mask
        return mask

    # ---- changes ------------------------------------------------------------------------------
    def reserve(self, request: Request, node: int, gpus: tuple[int, ...], admission: str = "guaranteed") -> Holding:
        """Take a request's share on `gpus` of `node`. The caller has checked that it fits."""
        share = share_of(request, admission)
        milli = request.milli if request.gpu_count > 0 else 0
        rec = Holding(share, node, gpus, milli, request.gpu_memory_mib, request.cpu_milli, request.memory_mib,
                      self._next_order())
        self._apply(rec, -1)
        self._hold(rec)
        self.reserved_now.add(request.id)
        self._fresh(rec, +1)
        return rec

    def release(self, reservation_id: str) -> Holding:
        rec = self.placed.pop(reservation_id)
        del self.on_node[rec.node][reservation_id]
        s = rec.share
        for index, key in ((self.by_team, s.team), (self.by_admission, s.admission), (self.by_priority, s.priority)):
            del index[key][reservation_id]
        if rec.share.group:
            self.group_held[rec.share.group] -= 1
        if reservation_id in self.reserved_now:
            self.reserved_now.discard(reservation_id)
            self._fresh(rec, -1)
        self._apply(rec, +1)
        return rec

    def _next_order(self) -> int:
        self.placements += 1
        return self.placements

    def restore(self, rec: Holding) -> None:
        """Put back a share released earlier (a rolled-back preemption), with its first `order`."""
        self._apply(rec, -1)
        self._hold(rec)

    def _fresh(self, rec: Holding, sign: int) -> None:
        for j in rec.gpus:
            self.fresh_milli[rec.node, j] += sign * rec.milli
            self.fresh_mem[rec.node, j] += sign * rec.gpu_memory_mib
        self.fresh_cpu[rec.node] += sign * rec.cpu_milli
        self.fresh_node_mem[rec.node] += sign * rec.node_memory_mib

    def _hold(self, rec: Holding) -> None:
        rid = rec.share.reservation_id
        if rec.share.group and rid not in self.placed:
            self.group_held[rec.share.group] += 1
        self.placed[rid] = rec
        self.on_node.setdefault(rec.node, {})[rid] = rec
        s = rec.share
        for index, key in ((self.by_team, s.team), (self.by_admission, s.admission), (self.by_priority, s.priority)):
            index.setdefault(key, {})[rid] = rec
        if s.external:
            self.protected.add(rid)

    def _apply(self, rec: Holding, sign: int) -> None:
        i = rec.node
        for j in rec.gpus:
            self.free[i, j] += sign * rec.milli
            self.mem_free[i, j] += sign * rec.gpu_memory_mib
            self._relabel(i, j, rec.share, -sign)
        if self.cpu_free[i] != UNTRACKED:
            self.cpu_free[i] += sign * rec.cpu_milli
        if self.node_mem_free[i] != UNTRACKED:
            self.node_mem_free[i] += sign * rec.node_memory_mib
        self.held_cpu[i] -= sign * rec.cpu_milli
        self.held_node_mem[i] -= sign * rec.node_memory_mib
        if rec.share.group:
            nodes = self.group_nodes.setdefault(rec.share.group, Counter())
            nodes[i] -= sign
            if nodes[i] <= 0:
                del nodes[i]
        self.version[i] += 1


class FleetLayout:
    """A fleet's nodes and GPUs laid out once. A caller that keeps its fleet between snapshots (the
    portal does, while the node and GPU rows are unchanged) passes it in Snapshot.layout: each
    snapshot's nodes are then either these very node objects (nothing on them) or copies with
    shares and free CPU and memory set, and the state starts from a copy of the layout instead of
    laying out 4,000 GPUs again (about 20 ms a snapshot at 500 nodes on a slow core)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        self.gpus = [tuple(g.uuid for g in n.gpus) for n in self.nodes]
        self.empty = ClusterState.from_snapshot(Snapshot(nodes=tuple(replace(n, gpus=tuple(
            replace(g, shares=()) for g in n.gpus)) for n in self.nodes)))
        self.slot = [{g.index: j for j, g in enumerate(sorted(n.gpus, key=lambda g: g.index))} for n in self.nodes]

    def fits(self, nodes: Sequence[Node]) -> bool:
        """Whether `nodes` are this fleet (same nodes in the same order, same GPUs on each)."""
        return len(nodes) == len(self.nodes) and all(
            node is own or (node.name == own.name and tuple(g.uuid for g in node.gpus) == gpus)
            for node, own, gpus in zip(nodes, self.nodes, self.gpus, strict=True))

    def state_of(self, nodes: Sequence[Node]) -> ClusterState:
        state = self.empty._empty_copy()
        state.cpu_free = _tracked([n.cpu_milli_free for n in nodes], len(nodes))
        state.node_mem_free = _tracked([n.memory_mib_free for n in nodes], len(nodes))
        state.ready = np.array([n.status == NodeStatus.READY for n in nodes], dtype=bool)
        state.node_labels = [dict(n.labels) for n in nodes]
        for i, (node, own) in enumerate(zip(nodes, self.nodes, strict=True)):
            if node is own:  # the fleet's own object: nothing on it
                continue
            slot = self.slot[i]
            for gpu in node.gpus:
                for share in gpu.shares:
                    state._hold_existing(i, slot[gpu.index], share)
        return state


def share_of(request: Request, admission: str = "guaranteed") -> Share:
    return Share(
        reservation_id=request.id,
        gpu_request=request.gpu_request if request.gpu_count > 0 else 1.0,
        gpu_memory_mib=request.gpu_memory_mib,
        priority=request.priority,
        team=request.team,
        affinity=request.affinity,
        anti_affinity=request.anti_affinity,
        exclusion=request.exclusion,
        group=request.group.name if request.group else None,
        admission=admission,
    )


def _index(at: dict[str, set[tuple[int, int]]], label: str, gpu: tuple[int, int], held: bool) -> None:
    gpus = at.setdefault(label, set())
    if held:
        gpus.add(gpu)
    else:
        gpus.discard(gpu)
        if not gpus:
            del at[label]


def _is_labelled(share: Share) -> int:
    return int(bool(share.affinity or share.anti_affinity or share.exclusion))


def _tracked(values: Sequence[int | None] | None, n: int) -> np.ndarray:
    if values is None:
        return np.full(n, UNTRACKED, dtype=np.int64)
    return np.array([UNTRACKED if v is None else v for v in values], dtype=np.int64)


_PEER_SLOTS: dict[tuple, list[frozenset[int]]] = {}


def _peer_slots_of(gpus: Sequence) -> list[frozenset[int]]:
    """Each GPU's NVLink peers as slots on its node. A fleet has few distinct layouts (500 nodes of
    8 linked GPUs: one), so each layout is worked out once per process, not once per GPU per snapshot."""
    layout = tuple((g.index, g.nvlink_peers) for g in gpus)
    slots = _PEER_SLOTS.get(layout)
    if slots is None:
        slot = {g.index: j for j, g in enumerate(gpus)}
        slots = [frozenset(slot[p] for p in g.nvlink_peers if p in slot) for g in gpus]
        if len(_PEER_SLOTS) > 4096:  # bounded: a fleet of odd layouts does not grow it forever
            _PEER_SLOTS.clear()
        _PEER_SLOTS[layout] = slots
    return list(slots)
