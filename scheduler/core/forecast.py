"""Estimated starts: the waiting queue run forward over the known ends of running reservations.

`estimate_starts` starts from the snapshot's state (`ClusterState.from_snapshot`, the cycle's
`choose` and scorer, so model, drained/lost nodes, exclusion, affinity, whole-GPU and node CPU and
memory rules all apply as they do in a cycle). Requests that fit now start at `now`. Then it walks
the known ends in time order; at each end time it releases what ends there (running shares whose
end is known, and requests placed earlier in the forecast whose duration is known) and tries the
remaining requests again in queue order: every remaining one, as the cycle does, so a small request
may pass a large one that is still blocked. Where no start is found, the estimate is `None` with
the reason in the user's words and a stable `code`:

- `now`: it fits now; `after_ends`: it starts when the named reservations end.
- `no_ready_gpu`: no ready GPU of the model it asks for could ever take it (absent, drained, lost,
  too little memory, not enough GPUs on one node), whatever ends.
- `unknown_ends`: the GPUs that could take it are held by reservations without a known end (or by
  waiting requests expected to start before it whose run time is unknown).
- `quota`: the gate (quota) does not let it use GPUs where room appears within the known ends.
- `pod_group`: a pod group whose members never fit together within the known ends.
- `behind`: more than `limit` requests wait ahead of it; `event_budget`: the forecast stopped
  after `max_events` ends before it could start.
- `invalid`: the request already holds a share in the snapshot.

Pod groups are forecast together: a group's members wait in one line at the place of its first
member and are placed with the cycle's own gang rule (at least the group's threshold at once,
running members counted), so a member's estimate is when its group can start.

Not modelled: preemption (a guarantee request may start earlier by evicting opportunistic work),
requests that arrive later with a higher priority, aging (the queue's order is taken as given) and
ends that come early. The walk does no work that cannot change an answer: requests of the same
shape wait in one line (if the first fails, the rest fail), and a line is tried again after an end
only when the end freed room on a ready node with a GPU of its model where its shape may fit (room
only grows when something ends, so a request that did not fit before can fit only where something
ended). Lines with affinity labels and pod groups are tried after every end (affinity looks at the
whole cluster); with a gate, a line whose allowed models grew is tried everywhere again.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from .cycle import _place_gang, _workload
from .engine import choose, make_scorer
from .forecast_preemption import evictable_room, might_preempt, preempt_on
from .fragmentation import FgdScorer, TypicalPod, typical_pods
from .model import MILLI, Request, Snapshot
from .queue import DEFAULT_AGING_S, effective_priority
from .scorers import Scorer, pick_slot
from .state import ClusterState

DEFAULT_LIMIT = 1000  # estimate this many waiting requests, the first in the queue
DEFAULT_MAX_EVENTS = 20_000  # ends walked at most

NOW = "now"
AFTER_ENDS = "after_ends"
NO_READY_GPU = "no_ready_gpu"
UNKNOWN_ENDS = "unknown_ends"
QUOTA = "quota"
POD_GROUP = "pod_group"
BEHIND = "behind"
EVENT_BUDGET = "event_budget"
INVALID = "invalid"


@dataclass(frozen=True)
class Estimate:
    """When a waiting request is expected to start (seconds, the caller's clock), or None, and why."""

    start: float | None
    reason: str
    code: str = ""


class Gate(Protocol):
    """What else than room decides whether a request may start: the portal's quota.

    `allowed(req)`: the GPU models the request may use now (None: any; empty: none now);
    `charge(req, model)`: it was placed in the forecast on a GPU of `model`;
    `refund(reservation_id)`: a reservation (running, or placed in the forecast) ended.
    `allowed` is asked often (after ends, for lines it had restricted): keep it cheap.
    """

    def allowed(self, req: Request) -> frozenset[str] | None: ...

    def charge(self, req: Request, model: str) -> None: ...

    def refund(self, reservation_id: str) -> None: ...


class Order(Protocol):
    """The cycle's queue order as the forecast runs forward. Under fair share the order follows each
    team's use, which the forecast changes as it places and ends work: `key(req, at)` ranks a waiting
    request at time `at` (lowest first); `charge` and `refund` as in Gate (one object may be both).
    Requests of one team, priority and shape must keep their order in `queue` under it (age does)."""

    def key(self, req: Request, at: float) -> Any: ...

    def charge(self, req: Request, model: str) -> None: ...

    def refund(self, reservation_id: str) -> None: ...


class QueueOrder:
    """Today's order (`queue.queue_order`: priority with aging, then the team's quota use, then
    age), with the use kept up to date as the forecast places and ends work."""

    def __init__(self, snapshot: Snapshot, aging_s: float = DEFAULT_AGING_S) -> None:
        self.aging_s = aging_s
        self.quota = {team: usage.quota_gpus for team, usage in snapshot.teams.items()}
        self.used = {team: usage.used_gpus for team, usage in snapshot.teams.items()}
        self.held: dict[str, tuple[str, float]] = {}  # reservation -> (team, GPUs it counts)
        for node in snapshot.nodes:
            for gpu in node.gpus:
                for share in gpu.shares:
                    team, gpus = self.held.get(share.reservation_id, (share.team, 0.0))
                    self.held[share.reservation_id] = (team, gpus + share.gpu_request)

    def key(self, req: Request, at: float) -> tuple[int, float, float, str]:
        if req.team in self.quota:
            quota, used = self.quota[req.team], self.used[req.team]
            ratio = used / quota if quota > 0 else 1e18
        else:
            ratio = 0.0
        return (-effective_priority(req, at, self.aging_s), ratio, req.created_at, req.id)

    def charge(self, req: Request, model: str) -> None:
        gpus = req.gpu_request * req.gpu_count
        self.held[req.id] = (req.team, gpus)
        if req.team in self.used:
            self.used[req.team] += gpus

    def refund(self, reservation_id: str) -> None:
        team, gpus = self.held.pop(reservation_id, ("", 0.0))
        if team in self.used:
            self.used[team] -= gpus


class _RoomScorer:
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


@dataclass
class _Line:
    """Waiting requests that succeed or fail together at one moment: one shape (or one pod group)."""

    waiting: deque[tuple[int, Request]]  # (place in the queue, request), in queue order
    models: frozenset[int] | None  # model ids it may use (None: any)
    always: bool  # tried after every end (affinity, pod groups)
    group: str | None = None
    last_allowed: frozenset[str] | None = None  # what the gate allowed at its last try
    quota_limited: bool = False  # the gate narrowed or refused it at its last try
    capable_gpus: int = 0  # ready GPUs that could take one GPU's worth of it when empty
    need: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # _need of its requests (one shape)
    fit: tuple = ()  # its shape for fitting (team and priority aside): lines alike fail alike

    @property
    def head(self) -> tuple[int, Request]:
        return self.waiting[0]


@dataclass
class _Forecast:
    state: ClusterState
    scorer: Scorer
    gate: Gate | None
    order: Order | None
    durations: Mapping[str, float]
    out: dict[str, Estimate]
    events: list[tuple[float, int, str]] = field(default_factory=list)
    seq: itertools.count = field(default_factory=itertools.count)
    forecast_ids: set[str] = field(default_factory=set)  # placed by the forecast itself
    unending: list[int] = field(default_factory=list)  # nodes of forecast placements without a duration
    node_models: list[frozenset[int]] = field(default_factory=list)
    on_node: dict[int, set[str]] = field(default_factory=dict)  # node -> reservations on it
    placed_at: set[int] = field(default_factory=set)  # nodes placed on at the current time
    # Nodes where, at the current time, a share with a priority ended (room any guarantee request
    # may now use), and where a team placed shares with a priority (its higher priorities may evict).
    freed_guaranteed: set[int] = field(default_factory=set)
    team_placed: dict[int, set[str]] = field(default_factory=dict)

    def release(self, rid: str) -> int:
        """End (or evict) a reservation in the forecast; the node it was on."""
        rec = self.state.release(rid)
        self.on_node[rec.node].discard(rid)
        if rec.share.priority > 0:
            self.freed_guaranteed.add(rec.node)
        if self.gate is not None:
            self.gate.refund(rid)
        if self.order is not None and self.order is not self.gate:
            self.order.refund(rid)
        return rec.node

    # ---- one try ------------------------------------------------------------------------------
    def _narrow(self, line: _Line, req: Request) -> Request | None:
        """The request as the gate lets it run now (None: not at all); remembers what it allowed."""
        if self.gate is None:
            return req
        allowed = self.gate.allowed(req)
        line.last_allowed = allowed
        line.quota_limited = False
        if allowed is None:
            return req
        wanted = req.gpu_model if req.gpu_model is not None else frozenset(self.state.models)
        models = wanted & allowed
        line.quota_limited = models != wanted
        if not models:
            return None
        return req if models == req.gpu_model else replace(req, gpu_model=models)

    def _placed(self, req: Request, t: float, why: str) -> None:
        rec = self.state.placed[req.id]
        self.on_node.setdefault(rec.node, set()).add(req.id)
        self.placed_at.add(rec.node)
        if req.priority > 0:
            self.team_placed.setdefault(rec.node, set()).add(req.team)
        code = NOW if why == "" else AFTER_ENDS
        self.out[req.id] = Estimate(t, why or "it fits now", code)
        model = self.state.models[int(self.state.gpu_model[rec.node, rec.gpus[0]])] if rec.gpus else ""
        if self.gate is not None:
            self.gate.charge(req, model)
        if self.order is not None and self.order is not self.gate:
            self.order.charge(req, model)
        self.forecast_ids.add(req.id)
        run = self.durations.get(req.id)
        if run is not None:
            heapq.heappush(self.events, (t + max(0.0, float(run)), next(self.seq), req.id))
        else:
            self.unending.append(rec.node)

    def try_head(self, line: _Line, t: float, why_of) -> list[int]:
        """Place the line's first request (or its pod group) at `t`; the nodes it took (none: it waits)."""
        if line.group is not None:
            return self._try_group(line, t, why_of)
        _, req = line.head
        use = self._narrow(line, req)
        if use is None:
            return []
        choice = choose(self.state, use, self.scorer)
        if choice is None:
            return []
        line.quota_limited = False
        self.state.reserve(req, choice.node, choice.slots)
        line.waiting.popleft()
        self._placed(req, t, why_of(choice.node))
        return [choice.node]

    def _try_group(self, line: _Line, t: float, why_of) -> list[int]:
        members = []
        for _, req in line.waiting:
            use = self._narrow(line, req)
            if use is not None:
                members.append(use)
        if not members:
            return []
        placed, _ = _place_gang(self.state, self.scorer, members)
        if not placed:
            return []
        ids = [p.request_id for p in placed]
        originals = {r.id: r for _, r in line.waiting}
        line.waiting = deque((pos, r) for pos, r in line.waiting if r.id not in set(ids))
        for rid in ids:
            self._placed(originals[rid], t, why_of(self.state.placed[rid].node))
        return [self.state.placed[rid].node for rid in ids]

    # ---- after an end -------------------------------------------------------------------------
    def summary(self, i: int) -> tuple[int, int, dict[int, tuple[int, int, int]]]:
        """Node `i`: CPU and memory left, and per GPU model (most compute free on one GPU, most GPU
        memory free on one GPU, fully free GPUs)."""
        st = self.state
        per: dict[int, tuple[int, int, int]] = {}
        for m, free, mem in zip(st.gpu_model[i].tolist(), st.free[i].tolist(), st.mem_free[i].tolist(), strict=True):
            if m < 0:
                continue
            top, top_mem, full = per.get(m, (0, 0, 0))
            per[m] = (max(top, free), max(top_mem, mem), full + (free >= MILLI))
        return int(st.cpu_free[i]), int(st.node_mem_free[i]), per


@dataclass
class _Shape:
    """Lines of one shape for fitting (teams and priorities apart): they fit, or not, alike."""

    need: tuple[int, int, int, int, int]
    models: frozenset[int] | None
    lines: list[_Line]


class _Index:
    """Shapes by GPU model, each model's ordered by the compute one GPU of theirs needs: after an end,
    only shapes whose need is within the most compute now free on one GPU of a model are looked at."""

    def __init__(self, lines: list[_Line]) -> None:
        shapes: dict[tuple, _Shape] = {}
        for line in lines:
            shapes.setdefault(line.fit, _Shape(line.need, line.models, [])).lines.append(line)
        self.groups: dict[int | None, tuple[list[int], list[_Shape]]] = {}
        self.cpu_only: list[_Shape] = []
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

    def candidates(self, top: Mapping[int, int]):
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
        self.cpu_only = [shape for shape in self.cpu_only if shape.lines]
        for m, (_, group) in list(self.groups.items()):
            for shape in group:
                shape.lines = [line for line in shape.lines if line.waiting]
            kept = [shape for shape in group if shape.lines]
            self.groups[m] = ([shape.need[0] for shape in kept], kept)


def _most_free(local: Mapping[int, tuple]) -> int:
    """The most compute free on one GPU of the summarised nodes."""
    return max((most for _, _, per in local.values() for most, _, _ in per.values()), default=0)


def _need(req: Request) -> tuple[int, int, int, int, int]:
    """What one request needs, as _might_fit reads it: milli per GPU, GPUs, GPU memory, CPU, memory."""
    return (MILLI if req.whole else req.milli), req.gpu_count, req.gpu_memory_mib, req.cpu_milli, req.memory_mib


def _might_fit(need: tuple[int, int, int, int, int], models: frozenset[int] | None, summaries) -> bool:
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


def _shape(req: Request, per_team: bool) -> tuple:
    """What decides whether a request fits: with `per_team`, its team and priority too (for the
    gate, the order and preemption, which answer per team and priority)."""
    key: tuple = (req.milli, req.gpu_count, req.gpu_model, req.gpu_memory_mib, req.cpu_milli, req.memory_mib,
                  req.exclusion, req.anti_affinity, req.affinity)
    return (*key, req.team, req.priority) if per_team else key


def _model_ids(state: ClusterState, req: Request) -> frozenset[int] | None:
    if req.gpu_model is None:
        return None
    return frozenset(state.model_id[m] for m in req.gpu_model if m in state.model_id)


def _model_text(req: Request) -> str:
    return "|".join(sorted(req.gpu_model)) if req.gpu_model else "any model"


def _capable(state: ClusterState, req: Request) -> tuple[int, str]:
    """Ready GPUs that could take one GPU's worth of `req` if nothing ran on them (0 with the reason
    when no ready node could ever take the whole request)."""
    model = _model_text(req)
    if req.gpu_count == 0:
        return (int(state.ready.sum()), "") if state.ready.any() else (0, "no estimate: no node is ready")
    of_model = state.valid & (state.model_mask(req.gpu_model) if req.gpu_model is not None else True)
    if not of_model.any():
        return 0, f"no estimate: the cluster has no GPU of model {model}"
    ready = of_model & state.ready[:, None]
    if not ready.any():
        return 0, (f"no estimate: no ready GPU of model {model}: all {int(of_model.sum())} are on nodes that "
                   "are draining or lost")
    big = ready & (state.mem_total >= req.gpu_memory_mib)
    if not big.any():
        return 0, f"no estimate: no ready GPU of model {model} has {req.gpu_memory_mib} MiB of memory"
    if not (big.sum(axis=1) >= req.gpu_count).any():
        most = int(big.sum(axis=1).max())
        return 0, (f"no estimate: no ready node has {req.gpu_count} GPUs of model {model} "
                   f"(at most {most} on one node)")
    return int(big.sum()), ""


def estimate_starts(
    snapshot: Snapshot,
    queue: Sequence[Request],
    ends: Mapping[str, float],
    *,
    now: float,
    durations: Mapping[str, float] | None = None,
    gate: Gate | None = None,
    order: Order | None = None,
    policy: str = "tessera",
    preemption: bool = True,
    typical: Sequence[TypicalPod] | None = None,
    limit: int = DEFAULT_LIMIT,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> dict[str, Estimate]:
    """An estimated start for each request of `queue` (in the order the cycle admits them).

    `ends`: reservation id -> its known end (same clock as `now`) for running shares of the
    snapshot; a share without one never ends within the forecast. `durations`: request id -> how
    long it runs once started, where known (its room is free again after that). `gate`: quota
    (default: none). `order`: the cycle's order as use changes (default: `queue`'s order throughout).
    `preemption`: after an end, guarantee requests may evict lower-priority work as the cycle does
    (the cycle is taken to have tried that for every request just before: none is tried at `now`).
    Only the first `limit` requests are estimated (those behind get `behind`), and at most
    `max_events` ends are walked. Every request of `queue` gets an Estimate.
    """
    ids = [r.id for r in queue]
    if len(set(ids)) != len(ids):
        raise ValueError("queue repeats a request id")
    durations = durations or {}
    state = ClusterState.from_snapshot(snapshot)
    scorer = make_scorer(policy, state, typical if typical is not None else typical_pods(_workload(snapshot, queue)))
    if isinstance(scorer, FgdScorer):
        scorer = _RoomScorer(scorer)
    out: dict[str, Estimate] = {}
    fc = _Forecast(state, scorer, gate, order, durations, out)
    fc.node_models = [frozenset(row[row >= 0].tolist()) for row in state.gpu_model]
    for rid, rec in state.placed.items():
        fc.on_node.setdefault(rec.node, set()).add(rid)

    # Lines, in queue order of their first request.
    lines: list[_Line] = []
    by_key: dict[tuple, _Line] = {}
    group_lines: dict[str, _Line] = {}
    cut_groups: set[str] = set()
    for pos, req in enumerate(queue):
        if req.id in state.placed:
            out[req.id] = Estimate(None, "it already holds a share", INVALID)
            continue
        if req.group is not None:
            line = group_lines.get(req.group.name)
            if line is None and pos >= limit:
                cut_groups.add(req.group.name)
            if req.group.name in cut_groups:
                out[req.id] = Estimate(None, f"no estimate: more than {limit} requests wait ahead of it", BEHIND)
                continue
            if line is None:
                line = group_lines[req.group.name] = _Line(deque(), None, True, req.group.name)
                lines.append(line)
            line.waiting.append((pos, req))
            continue
        if pos >= limit:
            out[req.id] = Estimate(None, f"no estimate: more than {limit} requests wait ahead of it", BEHIND)
            continue
        key = _shape(req, gate is not None or order is not None or (preemption and req.priority > 0))
        line = by_key.get(key)
        if line is None:
            line = by_key[key] = _Line(deque(), _model_ids(state, req), bool(req.affinity), need=_need(req),
                                       fit=_shape(req, False))
            lines.append(line)
        line.waiting.append((pos, req))

    # What could never run here, whatever ends, is answered at once and leaves the walk.
    live: list[_Line] = []
    for line in lines:
        if line.group is None:
            count, why = _capable(state, line.head[1])
            if not count:
                for _, req in line.waiting:
                    out[req.id] = Estimate(None, why, NO_READY_GPU)
                continue
            line.capable_gpus = count
        else:
            answers = [(_capable(state, r), r) for _, r in line.waiting]
            group = line.head[1].group
            assert group is not None
            if sum(1 for (count, _), _ in answers if count) < group.min_members:
                for (_, why), r in answers:
                    out[r.id] = Estimate(None, why or f"no estimate: too few members of pod group {group.name} "
                                         "could ever run here together", NO_READY_GPU)
                continue
            line.capable_gpus = max(count for (count, _), _ in answers)
        live.append(line)

    def admit(t: float, candidates: list[_Line], why_of, local: dict[int, tuple] | None = None,
              anywhere: frozenset[int] = frozenset()) -> None:
        """Try the candidate lines' requests in queue order while they start. With `local` (the
        summaries of the nodes where something just ended), a line not in `anywhere` (by id) can only
        fit there: it is tried only while its shape may fit on one of them. Lines of one shape fit or
        fail alike (without a gate, which answers per request): a shape that fails at `t` is not
        tried again at `t`, room only shrinking meanwhile."""

        def rank(line: _Line) -> Any:
            return line.head[0] if order is None else order.key(line.head[1], t)

        alike = gate is None
        groups: dict[object, list[_Line]] = {}
        for line in candidates:
            if line.waiting:
                single = line.group is not None or line.always or id(line) in anywhere or not alike
                groups.setdefault(id(line) if single else line.fit, []).append(line)

        def best(key: object) -> tuple[Any, _Line] | None:
            lines = [line for line in groups[key] if line.waiting]
            groups[key] = lines
            return min(((rank(line), line) for line in lines), key=lambda x: x[0], default=None)

        heap = []
        for k, key in enumerate(groups):
            first = best(key)
            if first is not None:
                heap.append((first[0], k, key, first[1]))
        heapq.heapify(heap)
        most = _most_free(local) if local is not None else 0
        dirty = False  # the candidates passed `select`'s room check; after a start, check again
        while heap:
            _, k, key, line = heapq.heappop(heap)
            if (dirty and local is not None and line.group is None and not line.always
                    and id(line) not in anywhere
                    and ((line.need[1] and line.need[0] > most)
                         or not _might_fit(line.need, line.models, local.values()))):
                continue
            took = fc.try_head(line, t, why_of)
            if not took:
                continue  # a shape (or a single line) that fails at `t` is not tried again at `t`
            dirty = True
            if local is not None:
                for i in took:
                    if i in local:
                        local[i] = fc.summary(i)
                most = _most_free(local)
            nxt = best(key)
            if nxt is not None:
                heapq.heappush(heap, (nxt[0], k, key, nxt[1]))

    admit(now, live, lambda node: "")
    live = [line for line in live if line.waiting]

    # A line that would not fit even once every known end has come (labels aside) waits for an
    # unknown end: answered now, and left out of the walk.
    room = _room_at_last(state, [*ends, *(rid for rid in fc.forecast_ids if rid in durations)])
    evictable = _Evictable(state)
    blocked = {id(line): line for line in live
               if not line.always and not _fits_in(state, room, line, evictable.get(line.head[1], None))}
    if blocked:
        _explain_rest(fc, list(blocked.values()), False, max_events)
        live = [line for line in live if id(line) not in blocked]

    for rid, end in ends.items():
        if rid in state.placed:
            heapq.heappush(fc.events, (max(float(end), now), next(fc.seq), rid))

    index = _Index([line for line in live if not line.always])
    always = [line for line in live if line.always]

    def select(nodes: list[int], ended: bool) -> tuple[list[_Line], dict[int, tuple], set[int]]:
        """Lines to try after room appeared on `nodes` (and, with a gate, after any end), the
        summaries of those nodes, and the ids of lines that may now fit anywhere."""
        chosen: list[_Line] = [line for line in always if line.waiting]
        anywhere = {id(line) for line in chosen}
        local: dict[int, tuple] = {}
        if nodes:
            local = {i: fc.summary(i) for i in nodes}
            seen: set[int] = set(anywhere)
            top: dict[int, int] = {}
            for _, _, per in local.values():
                for m, (most, _, _) in per.items():
                    top[m] = max(top.get(m, 0), most)
            for shape in index.candidates(top):
                if _might_fit(shape.need, shape.models, local.values()):
                    for line in shape.lines:
                        if line.waiting and id(line) not in seen:
                            seen.add(id(line))
                            chosen.append(line)
        if gate is not None and ended:  # a line the gate had narrowed may now use more models: anywhere
            for line in live:
                if (line.waiting and line.last_allowed is not None and id(line) not in anywhere
                        and gate.allowed(line.head[1]) != line.last_allowed):
                    if line not in chosen:
                        chosen.append(line)
                    anywhere.add(id(line))
        return chosen, local, anywhere

    def preempt(t: float, why_of) -> list[int]:
        """Guarantee requests that may now evict lower-priority work, as the cycle would; the nodes
        where something was evicted. The cycle found no preemption before; one can be new only
        where a share with a priority ended (what any guarantee request may use grew: the room of a
        priority-0 share that ends was evictable already) or, for a team, where it placed shares
        with a priority (which its higher priorities may evict)."""
        freed = {i for i in fc.freed_guaranteed if state.ready[i]}
        placed = {i: teams for i, teams in fc.team_placed.items() if state.ready[i]}
        nodes = sorted(freed | set(placed))
        if not nodes:
            return []
        rooms = {i: evictable_room(state, i, fc.on_node) for i in nodes}
        anyone_rooms = [rooms[i] for i in sorted(freed)]
        team_rooms: dict[str, list] = {}
        for i in nodes:
            for team in set(rooms[i].own) if i in freed else placed.get(i, ()):
                team_rooms.setdefault(team, []).append(rooms[i])
        top: dict[int, int] = {}  # per model, the most compute one GPU could have after evictions
        for i, room in rooms.items():
            most = list(room.compute)
            for recs in room.own.values():
                for rec in recs:
                    for j in rec.gpus:
                        most[j] += rec.milli
            for j, model in enumerate(state.gpu_model[i].tolist()[: int(state.gpu_count[i])]):
                top[model] = max(top.get(model, 0), most[j])
        lines: dict[int, _Line] = {}
        for shape in index.candidates(top):
            anyone = None
            for line in shape.lines:
                if not line.waiting:
                    continue
                req = line.head[1]
                if req.priority <= 0:
                    continue
                if anyone is None:
                    anyone = bool(anyone_rooms) and might_preempt(state, shape.need, shape.models, anyone_rooms)
                mine = team_rooms.get(req.team)
                if anyone or (mine and might_preempt(state, shape.need, shape.models, mine, req.team, req.priority)):
                    lines[id(line)] = line
        for line in always:
            if line.waiting and line.group is None and line.head[1].priority > 0:
                lines[id(line)] = line
        lines = sorted(lines.values(), key=lambda line: line.head[0] if order is None else order.key(line.head[1], t))
        evicted: list[int] = []
        for line in lines:
            while line.waiting:
                _, req = line.head
                use = fc._narrow(line, req)
                if use is None or not might_preempt(state, line.need, _model_ids(state, use), rooms.values(),
                                                    req.team, req.priority):
                    break
                found = preempt_on(state, use, nodes, fc.on_node)
                if found is None:
                    break
                choice, victims = found
                for rid in victims:
                    fc.release(rid)
                state.reserve(req, choice.node, choice.slots)
                line.waiting.popleft()
                line.quota_limited = False
                why = why_of(choice.node)
                why = (why + ", " if why != "when running reservations end" else "")
                fc._placed(req, t, f"{why}by preempting {_names(list(victims))} (lower priority) on "
                           f"{state.node_names[choice.node]}")
                rooms[choice.node] = evictable_room(state, choice.node, fc.on_node)
                evicted.append(choice.node)
        return evicted

    preempting = preemption and any(r.priority > 0 for line in live for _, r in line.waiting)
    walked = 0
    budget_hit = False
    waiting = sum(len(line.waiting) for line in live)
    started = len(fc.forecast_ids)
    while fc.events and len(fc.forecast_ids) - started < waiting:
        if walked >= max_events:
            budget_hit = True
            break
        t = fc.events[0][0]
        released: dict[int, list[str]] = {}
        fc.placed_at, fc.freed_guaranteed, fc.team_placed = set(), set(), {}
        while fc.events and fc.events[0][0] == t:
            _, _, rid = heapq.heappop(fc.events)
            walked += 1
            if rid not in state.placed:
                continue
            released.setdefault(fc.release(rid), []).append(rid)
        touched = [i for i in released if state.ready[i]]
        chosen, local, anywhere = select(touched, bool(released))

        def why_of(node: int, released=released) -> str:
            rids = released.get(node)
            name = state.node_names[node]
            if not rids:
                return "when running reservations end"
            own = [r for r in rids if r in fc.forecast_ids]
            if own and len(own) == len(rids):
                return f"when {_names(own)}, expected to start before it, finish(es) on {name}"
            return f"when {_names(rids)} end(s) on {name}"

        if chosen:
            admit(t, chosen, why_of, local, frozenset(anywhere))
        if preempting:  # after what ended or was placed now, guarantee work may evict lower priorities
            evicted = preempt(t, why_of)
            if evicted:
                chosen, local, anywhere = select(evicted, False)
                if chosen:
                    admit(t, chosen, why_of, local, frozenset(anywhere))
        index.forget_empty()

    _explain_rest(fc, live, budget_hit, max_events)
    return out


def _room_at_last(state: ClusterState, ending: list[str]) -> tuple[np.ndarray, ...]:
    """GPU compute and memory free per slot, CPU and memory free per node, once all of `ending`
    (the holders with a known end) have ended."""
    free, mem = state.free.copy(), state.mem_free.copy()
    cpu, node_mem = state.cpu_free.copy(), state.node_mem_free.copy()
    for rid in ending:
        rec = state.placed.get(rid)
        if rec is not None:
            for j in rec.gpus:
                free[rec.node, j] += rec.milli
                mem[rec.node, j] += rec.gpu_memory_mib
            cpu[rec.node] += rec.cpu_milli
            node_mem[rec.node] += rec.node_memory_mib
    return free, mem, cpu, node_mem


class _Evictable:
    """Compute held per GPU slot by shares a guarantee request could evict: priority-0 ones (any
    team's) and, per team, its own with a priority (by team, built when asked)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.zero = np.zeros_like(state.free)
        self.teams: dict[str, np.ndarray] = {}
        for rec in state.placed.values():
            target = self.zero if rec.share.priority == 0 else self.teams.setdefault(
                rec.share.team, np.zeros_like(state.free))
            for j in rec.gpus:
                target[rec.node, j] += rec.milli

    def get(self, req: Request, default: None) -> np.ndarray | None:
        if req.priority <= 0 or req.gpu_count == 0:
            return default
        own = self.teams.get(req.team)
        return self.zero if own is None else self.zero + own


def _fits_in(state: ClusterState, room: tuple[np.ndarray, ...], line: _Line, evictable: np.ndarray | None) -> bool:
    """Whether the line's shape fits somewhere in `room` (node rules, model, memory, compute; not
    labels), with `evictable` compute added (what it may preempt)."""
    milli, count, gpu_mem, cpu_need, mem_need = line.need
    free, mem_free, cpu, node_mem = room
    if evictable is not None:  # memory that evictions free is not counted: the GPU memory test is skipped
        free, gpu_mem = free + evictable, 0
    node_ok = state.ready & (cpu >= cpu_need) & (node_mem >= mem_need)
    if count == 0:
        return bool(node_ok.any())
    ok = (free >= milli) & node_ok[:, None]
    if gpu_mem > 0:
        ok &= mem_free >= gpu_mem
    req = line.head[1]
    if req.gpu_model is not None:
        ok &= state.model_mask(req.gpu_model)
    return bool((ok.sum(axis=1) >= count).any())


def _names(rids: list[str]) -> str:
    return ", ".join(rids) if len(rids) <= 3 else f"{len(rids)} reservations"


def _explain_rest(fc: _Forecast, lines: list[_Line], budget_hit: bool, max_events: int) -> None:
    """Why each request left without a start has none."""
    blocked_by_own: dict[frozenset[int] | None, bool] = {}
    for line in lines:
        if not line.waiting:
            continue
        req = line.head[1]
        if budget_hit:
            why = (f"no estimate: more than {max_events} running reservations end before it could start "
                   "(the forecast looks no further)")
            code = EVENT_BUDGET
        elif line.quota_limited:
            allowed = line.last_allowed or frozenset()
            now_ok = "|".join(sorted(allowed)) if allowed else "no GPU"
            why = (f"no estimate: its team's quota lets it use {now_ok} now, and no known end frees enough "
                   f"quota for {_model_text(req)}")
            code = QUOTA
        elif line.group is not None:
            group = req.group
            assert group is not None
            why = (f"no estimate: pod group {group.name} needs {group.min_members} members placed together, "
                   "and the GPUs that could take them are held by reservations without a known end")
            code = POD_GROUP
        else:
            if line.models not in blocked_by_own:
                blocked_by_own[line.models] = any(
                    line.models is None or fc.node_models[i] & line.models for i in fc.unending)
            tail = (" (or by waiting requests expected to start before it, whose run time is not known)"
                    if blocked_by_own[line.models] else "")
            why = (f"no estimate: the {line.capable_gpus} ready GPU(s) of model {_model_text(req)} that could "
                   f"take it are held by reservations without a known end{tail}")
            code = UNKNOWN_ENDS
        for _, r in line.waiting:
            fc.out[r.id] = Estimate(None, why, code)

