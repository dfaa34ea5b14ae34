"""How the forecast holds the waiting queue: lines of requests that start or fail together, shapes
of lines that fit alike, and an index of shapes by GPU model and size.

A line is one shape of request (with the gate, the order or preemption, one team and priority
too; or one pod group) in queue order: if its first request does not fit, none does. Lines of one
shape (teams and priorities aside) fit or not alike, so after an end the index offers shapes whose
need is within the room that appeared, and a shape is checked once against the nodes concerned.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..fragmentation import FgdScorer
from ..model import MILLI, Request
from ..scorers import pick_slot
from ..state import ClusterState

Need = tuple[int, int, int, int, int]  # milli per GPU (1000 when whole), GPUs, GPU memory, CPU, memory
Summary = tuple[int, int, dict[int, tuple[int, int, int]]]  # see Walk.summary


@dataclass
class Line:
    """Waiting requests that succeed or fail together at one moment: one shape (or one pod group)."""

    waiting: deque[tuple[int, Request]]  # (place in the queue, request), in queue order
    models: frozenset[int] | None  # model ids it may use (None: any)
    always: bool  # tried after every end (affinity, pod groups)
    group: str | None = None
    last_allowed: frozenset[str] | None = None  # what the gate allowed at its last try
    quota_limited: bool = False  # the gate narrowed or refused it at its last try
    capable_gpus: int = 0  # ready GPUs that could take one GPU's worth of it when empty
    need: Need = (0, 0, 0, 0, 0)
    fit: tuple = ()  # its shape for fitting (team and priority aside): lines alike fail alike
    team: str = ""  # its requests' team and priority, where lines are kept per team and priority
    priority: int = 0

    @property
    def head(self) -> tuple[int, Request]:
        return self.waiting[0]


def need_of(req: Request) -> Need:
    return (MILLI if req.whole else req.milli), req.gpu_count, req.gpu_memory_mib, req.cpu_milli, req.memory_mib


def shape_of(req: Request, per_team: bool) -> tuple:
    """What decides whether a request fits: with `per_team`, its team and priority too (for the
    gate, the order and preemption, which answer per team and priority)."""
    key: tuple = (req.milli, req.gpu_count, req.gpu_model, req.gpu_memory_mib, req.cpu_milli, req.memory_mib,
                  req.exclusion, req.anti_affinity, req.affinity)
    return (*key, req.team, req.priority) if per_team else key


def model_ids(state: ClusterState, req: Request) -> frozenset[int] | None:
    if req.gpu_model is None:
        return None
    return frozenset(state.model_id[m] for m in req.gpu_model if m in state.model_id)


def might_fit(need: Need, models: frozenset[int] | None, summaries) -> bool:
    """A necessary condition for a request to fit on one of the summarised nodes (labels not looked at)."""
    milli, count, gpu_mem, cpu_need, mem_need = need
    for cpu, mem, per in summaries:
        if cpu < cpu_need or mem < mem_need:
            continue
        if count == 0:
            return True
        whole = 0
        for m, (top, top_mem, full) in per.items():
            if (models is not None and m not in models) or top_mem < gpu_mem:
                continue
            if count == 1:
                if top >= milli:
                    return True
            else:
                whole += full
        if whole >= count:
            return True
    return False


def most_free(local: Mapping[int, Summary]) -> int:
    """The most compute free on one GPU of the summarised nodes."""
    return max((most for _, _, per in local.values() for most, _, _ in per.values()), default=0)


@dataclass
class Shape:
    """Lines of one shape for fitting (teams and priorities apart): they fit, or not, alike."""

    need: Need
    models: frozenset[int] | None
    lines: list[Line]
    guarantee: list[Line] = field(default_factory=list)  # its lines with a priority (that may preempt)


class Index:
    """Shapes by GPU model, each model's ordered by the compute one GPU of theirs needs: after an end,
    only shapes whose need is within the most compute now free on one GPU of a model are looked at."""

    def __init__(self, lines: list[Line]) -> None:
        shapes: dict[tuple, Shape] = {}
        for line in lines:
            shape = shapes.setdefault(line.fit, Shape(line.need, line.models, []))
            shape.lines.append(line)
            if line.priority > 0:
                shape.guarantee.append(line)
        self.groups: dict[int | None, tuple[list[int], list[Shape]]] = {}
        self.cpu_only: list[Shape] = []
        for shape in shapes.values():
            if shape.need[1] == 0:
                self.cpu_only.append(shape)
                continue
            for m in shape.models if shape.models is not None else (None,):
                self.groups.setdefault(m, ([], []))[1].append(shape)
        for keys, group in self.groups.values():
            group.sort(key=lambda shape: shape.need[0])
            keys[:] = [shape.need[0] for shape in group]
        self.rounds = 0

    def candidates(self, top: Mapping[int, int]) -> Iterator[Shape]:
        """Shapes (each once) whose need fits `top` (model id -> most compute free on one GPU)."""
        seen: set[int] = set()
        for shape in self.cpu_only:
            seen.add(id(shape))
            yield shape
        for m, most in (*top.items(), (None, max(top.values(), default=0))):
            found = self.groups.get(m)
            if found is None:
                continue
            keys, group = found
            for shape in group[: bisect.bisect_right(keys, most)]:
                if id(shape) not in seen:
                    seen.add(id(shape))
                    yield shape

    def forget_empty(self) -> None:
        """Drop emptied lines and shapes now and then (meanwhile their lines are skipped as empty)."""
        self.rounds += 1
        if self.rounds % 64:
            return
        for shape in self.cpu_only:
            shape.lines = [line for line in shape.lines if line.waiting]
            shape.guarantee = [line for line in shape.guarantee if line.waiting]
        self.cpu_only = [shape for shape in self.cpu_only if shape.lines]
        for m, (_, group) in list(self.groups.items()):
            for shape in group:
                shape.lines = [line for line in shape.lines if line.waiting]
                shape.guarantee = [line for line in shape.guarantee if line.waiting]
            kept = [shape for shape in group if shape.lines]
            self.groups[m] = ([shape.need[0] for shape in kept], kept)


class RoomScorer:
    """An FGD-family scorer's scores for the nodes with room only.

    FgdScorer keeps every request shape's scores for every node, recomputing the nodes changed
    since the shape was last scored: right for a cycle, but the forecast changes a node at every
    end and tries hundreds of shapes, each of which fits on one or two nodes at a time. The values
    (node_values) and the slot rule are the scorer's own, so `choose` picks the same node and GPU
    (tests/scheduler/test_forecast.py compares with a walk that uses the scorer as the cycle does).
    """

    def __init__(self, inner: FgdScorer) -> None:
        self.inner = inner
        self.name = inner.name

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        n = ok.shape[0]
        nodes = np.flatnonzero(room)
        best = np.full(n, -np.inf)
        slot = np.full(n, -1, dtype=np.int64)
        one_gpu = req.gpu_count == 1 and not req.whole
        if nodes.size == 1:
            # One node has room (the usual case after an end): the scores cannot change the node,
            # and on one GPU that fits, nor the GPU.
            i = int(nodes[0])
            fits = np.flatnonzero(ok[i])
            if not one_gpu or fits.size == 1:
                best[i] = 0.0
                slot[i] = int(fits[0]) if one_gpu else -1
                return best, slot
        self.inner.frag.refresh()
        values = self.inner.node_values(req, nodes)
        if one_gpu:
            values = np.where(state.free[nodes] >= req.milli, values, -np.inf)
            best[nodes], slot[nodes] = pick_slot(values, ok[nodes] & np.isfinite(values))
        else:
            best[nodes] = values
        return best, slot
