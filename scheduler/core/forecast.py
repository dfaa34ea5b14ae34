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

import heapq
import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from .cycle import _place_gang, _workload
from .engine import choose, make_scorer
from .fragmentation import TypicalPod, typical_pods
from .model import MILLI, Request, Snapshot
from .scorers import Scorer
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

    @property
    def head(self) -> tuple[int, Request]:
        return self.waiting[0]


@dataclass
class _Forecast:
    state: ClusterState
    scorer: Scorer
    gate: Gate | None
    durations: Mapping[str, float]
    out: dict[str, Estimate]
    events: list[tuple[float, int, str]] = field(default_factory=list)
    seq: itertools.count = field(default_factory=itertools.count)
    forecast_ids: set[str] = field(default_factory=set)  # placed by the forecast itself
    unending: list[int] = field(default_factory=list)  # nodes of forecast placements without a duration
    node_models: list[frozenset[int]] = field(default_factory=list)

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
        code = NOW if why == "" else AFTER_ENDS
        self.out[req.id] = Estimate(t, why or "it fits now", code)
        if self.gate is not None:
            model = self.state.models[int(self.state.gpu_model[rec.node, rec.gpus[0]])] if rec.gpus else ""
            self.gate.charge(req, model)
        self.forecast_ids.add(req.id)
        run = self.durations.get(req.id)
        if run is not None:
            heapq.heappush(self.events, (t + max(0.0, float(run)), next(self.seq), req.id))
        else:
            self.unending.append(rec.node)

    def try_head(self, line: _Line, t: float, why_of) -> bool:
        """Place the line's first request (or its pod group) at `t`; True if it started."""
        if line.group is not None:
            return self._try_group(line, t, why_of)
        _, req = line.head
        use = self._narrow(line, req)
        if use is None:
            return False
        choice = choose(self.state, use, self.scorer)
        if choice is None:
            return False
        line.quota_limited = False
        self.state.reserve(req, choice.node, choice.slots)
        line.waiting.popleft()
        self._placed(req, t, why_of(choice.node))
        return True

    def _try_group(self, line: _Line, t: float, why_of) -> bool:
        members = []
        for _, req in line.waiting:
            use = self._narrow(line, req)
            if use is not None:
                members.append(use)
        if not members:
            return False
        placed, _ = _place_gang(self.state, self.scorer, members)
        if not placed:
            return False
        ids = {p.request_id for p in placed}
        originals = {r.id: r for _, r in line.waiting}
        line.waiting = deque((pos, r) for pos, r in line.waiting if r.id not in ids)
        for rid in ids:
            self._placed(originals[rid], t, why_of(self.state.placed[rid].node))
        return True

    # ---- after an end -------------------------------------------------------------------------
    def summaries(self, nodes: list[int]) -> list[tuple[int, int, dict[int, tuple[int, int, int]]]]:
        """Per node: CPU and memory left, and per GPU model (most compute free on one GPU, most GPU
        memory free on one GPU, fully free GPUs)."""
        st = self.state
        out = []
        for i in nodes:
            per: dict[int, tuple[int, int, int]] = {}
            for m, free, mem in zip(st.gpu_model[i].tolist(), st.free[i].tolist(), st.mem_free[i].tolist(),
                                    strict=True):
                if m < 0:
                    continue
                top, top_mem, full = per.get(m, (0, 0, 0))
                per[m] = (max(top, free), max(top_mem, mem), full + (free >= MILLI))
            out.append((int(st.cpu_free[i]), int(st.node_mem_free[i]), per))
        return out


def _might_fit(req: Request, models: frozenset[int] | None, summaries) -> bool:
    """A necessary condition for `req` to fit on one of the summarised nodes (labels not looked at)."""
    need = MILLI if req.whole else req.milli
    for cpu, mem, per in summaries:
        if cpu < req.cpu_milli or mem < req.memory_mib:
            continue
        if req.gpu_count == 0:
            return True
        whole = 0
        for m, (top, top_mem, full) in per.items():
            if (models is not None and m not in models) or top_mem < req.gpu_memory_mib:
                continue
            if req.gpu_count == 1:
                if top >= need:
                    return True
            else:
                whole += full
        if whole >= req.gpu_count:
            return True
    return False


def _shape(req: Request, gated: bool) -> tuple:
    key: tuple = (req.milli, req.gpu_count, req.gpu_model, req.gpu_memory_mib, req.cpu_milli, req.memory_mib,
                  req.exclusion, req.anti_affinity, req.affinity)
    if gated:  # the gate may answer differently per team and priority
        key += (req.team, req.priority)
    return key


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
    policy: str = "tessera",
    typical: Sequence[TypicalPod] | None = None,
    limit: int = DEFAULT_LIMIT,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> dict[str, Estimate]:
    """An estimated start for each request of `queue` (in the order the cycle admits them).

    `ends`: reservation id -> its known end (same clock as `now`) for running shares of the
    snapshot; a share without one never ends within the forecast. `durations`: request id -> how
    long it runs once started, where known (its room is free again after that). `gate`: quota
    (default: none). Only the first `limit` requests are estimated (those behind get `behind`), and
    at most `max_events` ends are walked. Every request of `queue` gets an Estimate.
    """
    ids = [r.id for r in queue]
    if len(set(ids)) != len(ids):
        raise ValueError("queue repeats a request id")
    durations = durations or {}
    state = ClusterState.from_snapshot(snapshot)
    scorer = make_scorer(policy, state, typical if typical is not None else typical_pods(_workload(snapshot, queue)))
    out: dict[str, Estimate] = {}
    fc = _Forecast(state, scorer, gate, durations, out)
    fc.node_models = [frozenset(row[row >= 0].tolist()) for row in state.gpu_model]

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
        key = _shape(req, gate is not None)
        line = by_key.get(key)
        if line is None:
            line = by_key[key] = _Line(deque(), _model_ids(state, req), bool(req.affinity))
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

    def admit(t: float, candidates: list[_Line], why_of) -> None:
        """Try each candidate line's requests in queue order while they start."""
        heap = [(line.head[0], k, line) for k, line in enumerate(candidates) if line.waiting]
        heapq.heapify(heap)
        while heap:
            _, k, line = heapq.heappop(heap)
            if fc.try_head(line, t, why_of) and line.waiting:
                heapq.heappush(heap, (line.head[0], k, line))

    admit(now, live, lambda node: "")
    live = [line for line in live if line.waiting]

    for rid, end in ends.items():
        if rid in state.placed:
            heapq.heappush(fc.events, (max(float(end), now), next(fc.seq), rid))

    by_model: dict[int, list[_Line]] = {}
    any_model: list[_Line] = []
    always: list[_Line] = []
    for line in live:
        if line.always:
            always.append(line)
        elif line.models is None:
            any_model.append(line)
        else:
            for m in line.models:
                by_model.setdefault(m, []).append(line)

    walked = 0
    budget_hit = False
    remaining = sum(len(line.waiting) for line in live)
    while fc.events and remaining:
        if walked >= max_events:
            budget_hit = True
            break
        t = fc.events[0][0]
        released: dict[int, list[str]] = {}
        while fc.events and fc.events[0][0] == t:
            _, _, rid = heapq.heappop(fc.events)
            walked += 1
            if rid not in state.placed:
                continue
            rec = state.release(rid)
            released.setdefault(rec.node, []).append(rid)
            if gate is not None:
                gate.refund(rid)
        if not released:
            continue
        touched = [i for i in released if state.ready[i]]
        chosen: dict[int, _Line] = {id(line): line for line in always if line.waiting}
        if touched:
            models = frozenset().union(*(fc.node_models[i] for i in touched))
            maybe: dict[int, _Line] = {id(line): line for line in any_model if line.waiting}
            for m in models:
                for line in by_model.get(m, ()):
                    if line.waiting:
                        maybe[id(line)] = line
            summaries = fc.summaries(touched)
            for key, line in maybe.items():
                if key not in chosen and _might_fit(line.head[1], line.models, summaries):
                    chosen[key] = line
        if gate is not None:  # a line the gate had narrowed may now use more models: anywhere
            for line in live:
                if (line.waiting and line.last_allowed is not None and id(line) not in chosen
                        and gate.allowed(line.head[1]) != line.last_allowed):
                    chosen[id(line)] = line
        if not chosen:
            continue

        def why_of(node: int, released=released) -> str:
            rids = released.get(node)
            name = state.node_names[node]
            if not rids:
                return "when running reservations end"
            own = [r for r in rids if r in fc.forecast_ids]
            if own and len(own) == len(rids):
                return f"when {_names(own)}, expected to start before it, finish(es) on {name}"
            return f"when {_names(rids)} end(s) on {name}"

        before = {id(line): len(line.waiting) for line in chosen.values()}
        admit(t, sorted(chosen.values(), key=lambda line: line.head[0]), why_of)
        remaining -= sum(before[k] - len(line.waiting) for k, line in chosen.items())

    _explain_rest(fc, live, budget_hit, max_events)
    return out


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

