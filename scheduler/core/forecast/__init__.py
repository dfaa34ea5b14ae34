"""Estimated starts: the waiting queue run forward over the known ends of running reservations.

`estimate_starts(snapshot, queue, ends, *, now, durations=None, gate=None, order=None, policy,
preemption=True, limit=1000, max_events=20000) -> {request id: Estimate(start, reason, code)}`

It starts from the snapshot's state (`ClusterState.from_snapshot`, the cycle's `choose` and
scorer, so model, drained/lost nodes, exclusion, affinity, whole-GPU and node CPU and memory rules
all apply as they do in a cycle). Requests that fit now start at `now`. Then it walks the known
ends in time order; at each end time it releases what ends there (running shares whose end is
known, and requests placed earlier in the forecast whose duration is known), tries the remaining
requests again in queue order (every remaining one, as the cycle does, so a small request may pass
a large one that is still blocked), and lets guarantee requests evict lower-priority work where
the cycle's preemption rule would now allow it. Where no start is found, the estimate's start is
None, with the reason in the user's words and a stable `code`:

- `now`: it fits now; `after_ends`: it starts when the named reservations end (or by preempting).
- `no_ready_gpu`: no ready GPU of the model it asks for could ever take it (absent, drained, lost,
  too little memory, not enough GPUs on one node), whatever ends.
- `unknown_ends`: the GPUs that could take it are held by reservations without a known end (or by
  waiting requests expected to start before it whose run time is unknown).
- `quota`: the gate (quota) does not let it use GPUs where room appears within the known ends.
- `pod_group`: a pod group whose members never fit together within the known ends.
- `behind`: more than `limit` requests wait ahead of it; `event_budget`: the forecast stopped
  after `max_events` ends before it could start.
- `invalid`: the request already holds a share in the snapshot.

Booked windows (`Snapshot.bookings`) take their room from their lead time (now, where it has begun)
to their end, before any waiting request, on the GPUs the cycle would hold for them, so a request
waits for a booked window as it waits for running work (`_with_bookings`, `Walk.hold_bookings`).

Planned drains (`drains`, `PlannedDrain`; drains.py): a node takes no new work from a drain's start
(what runs there runs on) and takes work again at its end (open-ended: never); a node draining now
by a drain passed for it comes back at that drain's end. A request that only such nodes could take
waits for the end, and one that only nodes closed for good could take has no estimate.

Pod groups are forecast together: a group's members wait in one line at the place of its first
member and are placed with the cycle's own gang rule (at least the group's threshold at once,
running members counted), so a member's estimate is when its group can start.

Hooks: a `Gate` (quota: which models a request may use now, charged and refunded as the forecast
places and ends work) and an `Order` (the cycle's order as use changes: `QueueOrder` is today's
rule; without one, the order of `queue` holds throughout). `RunLengths` turns expiries into likely
ends from what ended reservations used, for callers that want a likely start rather than the latest.
`after_cycle` is a cycle's snapshot with what the cycle committed (the forecast's start after it).

`replay_starts` (replay.py) is the same answer by the engine itself: `decide` replayed forward
over the ends and arrivals, at the portal's cadence, victims waiting again. Told every end and
arrival exactly it gives every job its real start (the walk: median error 0.063 on a 10 h trace,
0.002 with `requeue`); it costs a cycle over the whole queue per end, and with guessed ends it
is no closer, so the portal keeps the walk without `requeue` (bench/results/fairshare/README.md).

Not modelled: requests that arrive later (a higher priority, or a team below its share, passes
ahead), ends that come early (unless the caller passes likely ends), and batch work whose end
nobody knows. The walk does no work that cannot change an answer (lines.py, walk.py): requests
of one shape wait in one line (if the first fails, the rest fail), and a line is tried again
after an end only where room appeared on a ready node with a GPU of its model and its shape may
fit there (room only grows when something ends).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from ..cycle import cycle_workload
from ..engine import make_scorer
from ..fragmentation import FgdScorer, TypicalPod, typical_pods
from ..model import PlannedDrain, Request, Snapshot
from ..state import ClusterState
from .after import after_cycle
from .answers import (
    AFTER_ENDS,
    ARRIVALS,
    BEHIND,
    EVENT_BUDGET,
    INVALID,
    NO_READY_GPU,
    NOW,
    POD_GROUP,
    QUOTA,
    UNKNOWN_ENDS,
    Estimate,
    behind,
    capable,
)
from .arrivals import Arrivals, Expected
from .drains import Drains
from .hooks import Gate, Order, QueueOrder
from .lines import Line, RoomScorer, model_ids, need_of, shape_of
from .replay import replay_starts
from .run_lengths import RunLengths
from .walk import Walk

DEFAULT_LIMIT = 1000  # estimate this many waiting requests, the first in the queue
DEFAULT_MAX_EVENTS = 20_000  # ends walked at most

__all__ = [
    "AFTER_ENDS",
    "ARRIVALS",
    "BEHIND",
    "DEFAULT_LIMIT",
    "DEFAULT_MAX_EVENTS",
    "EVENT_BUDGET",
    "INVALID",
    "NOW",
    "NO_READY_GPU",
    "POD_GROUP",
    "QUOTA",
    "UNKNOWN_ENDS",
    "Arrivals",
    "Estimate",
    "Expected",
    "Gate",
    "Order",
    "QueueOrder",
    "RunLengths",
    "after_cycle",
    "estimate_starts",
    "replay_starts",
]


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
    arrivals: Sequence[Expected] = (),
    arrivals_until: float | None = None,
    withhold: bool = True,
    requeue: Mapping[str, Request] | None = None,
    drains: Sequence[PlannedDrain] = (),
) -> dict[str, Estimate]:
    """An estimated start for each request of `queue` (in the order the cycle admits them).

    `ends`: reservation id -> its known end (same clock as `now`) for running shares of the
    snapshot; a share without one never ends within the forecast, unless it is being reclaimed
    (`Share.reclaim_at`: it ends then at the latest). `durations`: request id -> how
    long it runs once started, where known (its room is free again after that). `gate`: quota
    (default: none). `order`: the cycle's order as use changes (default: `queue`'s order throughout).
    `preemption`: after an end, guarantee requests may evict lower-priority work as the cycle does
    (the cycle is taken to have tried that for every request just before: none is tried at `now`).
    `typical`: the workload the FGD-family scorers plan for (default: as the cycle computes it).
    `arrivals`: work expected to arrive (`Arrivals.forward`): each joins the queue at its time, is
    ranked by `order` (without one, behind the queue) and runs its expected run time once placed.
    `arrivals_until`: the end of the time they cover (default: the last one's arrival). With
    `withhold`, a start that depends mainly on them is not given (`ARRIVALS`, see `_withhold`).
    Only the first `limit` requests are estimated (those behind get `behind`), and at most
    `max_events` ends and arrivals are walked. `requeue` (running reservation -> its request):
    work evicted in the forecast waits again as itself, ranked by its age, as in the cycle (an
    empty mapping: the forecast's own placements only; None: evicted work vanishes). Every request
    of `queue` gets an Estimate. `drains`: the nodes' planned drains (`PlannedDrain`; drains.py):
    a node takes no new work over one, and again after its end.
    """
    ids = [r.id for r in queue]
    if len(set(ids)) != len(ids):
        raise ValueError("queue repeats a request id")
    state = ClusterState.from_snapshot(snapshot)
    if typical is None:
        typical = typical_pods(cycle_workload(snapshot, queue))
    scorer = make_scorer(policy, state, typical)
    if isinstance(scorer, FgdScorer):
        scorer = RoomScorer(scorer)
    if arrivals:
        durations = {**(durations or {}), **{e.request.id: e.run_s for e in arrivals}}
    walk = Walk(state, scorer, gate=gate, order=order, durations=durations or {}, preemption=preemption,
                max_events=max_events, requeue=requeue)
    if drains:
        walk.plan_drains(Drains(state, snapshot.nodes, drains, now), now)
    ends = _with_bookings(walk, state, snapshot, ends, now)
    out = walk.out
    lines = _lines(state, [*queue, *(e.request for e in arrivals)], limit,
                   per_team=lambda req: gate is not None or order is not None or (preemption and req.priority > 0),
                   out=out, expected=len(queue))
    ever = walk.drains.ever if walk.drains is not None else None
    walk.run(_startable(state, lines, out, ever), _with_reclaims(state, ends), now,
             {e.request.id: e.at for e in arrivals})
    if arrivals and withhold:
        until = arrivals_until if arrivals_until is not None else max(e.at for e in arrivals)
        _withhold(out, walk, state, until - now, now)
    return out


def _withhold(out: dict[str, Estimate], walk: Walk, state: ClusterState, span_s: float, now: float) -> None:
    """No start where it rests mainly on work not yet submitted: where the room that came free on
    its GPU model before it went more to expected arrivals than to requests that wait now, or where
    it lies beyond the expected arrivals (the forecast expects nothing to arrive after them: too
    far ahead to tell)."""
    hours = f"{span_s / 3600:.0f} h" if span_s >= 3600 else f"{span_s / 60:.0f} min"
    for rid, (m, expected, waiting) in walk.ahead.items():
        e = out.get(rid)
        if e is None or e.start is None or e.code != AFTER_ENDS:
            continue
        if e.start > now + span_s:
            why = (f"no estimate: it would start more than {hours} from now, and what is submitted meanwhile "
                   "decides when (the forecast looks that far ahead at the work expected to arrive)")
        elif expected > waiting:
            why = (f"no estimate: it waits mainly for work not yet submitted: before it, {expected} request(s) "
                   f"expected to arrive would start on the {state.models[m]} GPUs (a team further below its share, "
                   f"or a higher priority), against {waiting} that wait now")
        else:
            continue
        out[rid] = Estimate(None, why, ARRIVALS, withheld=e.start)


def _with_bookings(walk: Walk, state: ClusterState, snapshot: Snapshot, ends: Mapping[str, float],
                   now: float) -> Mapping[str, float]:
    """The snapshot's bookings in the walk: the room of those whose lead time has begun is held now
    (where it fits: the cycle holds it), ending with their window (returned with `ends`); the others
    take theirs when their lead time begins (`Walk.hold_bookings`). No request starts on it then."""
    live = sorted((b for b in snapshot.bookings if b.ends_at > now and b.gpu_model in state.model_id
                   and b.id not in state.placed), key=lambda b: (b.starts_at, b.id))
    if not live:
        return ends
    walk.booking_due = [b for b in live if b.held_from() <= now]
    walk.bookings = {b.id: b for b in live if b.held_from() > now}
    walk.hold_bookings()
    held = {b.id: b.ends_at for b in live if b.id in state.placed}
    return {**ends, **held} if held else ends


def _with_reclaims(state: ClusterState, ends: Mapping[str, float]) -> Mapping[str, float]:
    """`ends` with each share being reclaimed ending at its reclaim time at the latest: a known end
    the snapshot itself holds (the cycle preempts it then)."""
    reclaimed = {rid: rec.share.reclaim_at for rid, rec in state.placed.items() if rec.share.reclaim_at is not None}
    if not reclaimed:
        return ends
    return {**ends, **{rid: min(at, ends.get(rid, at)) for rid, at in reclaimed.items()}}


def _lines(state: ClusterState, queue: Sequence[Request], limit: int, per_team, out: dict[str, Estimate],
           expected: int) -> list[Line]:
    """The queue as lines, in the order of their first request; what is answered at once goes to `out`.
    From `expected` on, `queue` holds expected arrivals: never cut by `limit`."""
    lines: list[Line] = []
    by_key: dict[tuple, Line] = {}
    group_lines: dict[str, Line] = {}
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
                out[req.id] = behind(limit)
                continue
            if line is None:
                line = group_lines[req.group.name] = Line(deque(), None, True, req.group.name)
                lines.append(line)
            line.waiting.append((pos, req))
            continue
        if limit <= pos < expected:
            out[req.id] = behind(limit)
            continue
        apart = per_team(req)
        key = shape_of(req, apart)
        line = by_key.get(key)
        if line is None:
            line = by_key[key] = Line(deque(), model_ids(state, req), bool(req.affinity), need=need_of(req),
                                      fit=shape_of(req, False), team=req.team if apart else "",
                                      priority=req.priority if apart else 0)
            lines.append(line)
        line.waiting.append((pos, req))
    return lines


def _startable(state: ClusterState, lines: list[Line], out: dict[str, Estimate],
               ever: np.ndarray | None = None) -> list[Line]:
    """The lines that some ready node could take, whatever ends (`ever`: the nodes that take work
    at some time of the forecast; default: those ready now); the others are answered in `out`."""
    live: list[Line] = []
    for line in lines:
        if line.group is None:
            count, why = capable(state, line.head[1], ever)
            if not count:
                for _, req in line.waiting:
                    out[req.id] = Estimate(None, why, NO_READY_GPU)
                continue
            line.capable_gpus = count
        else:
            answers = [(capable(state, r, ever), r) for _, r in line.waiting]
            group = line.head[1].group
            assert group is not None
            if sum(1 for (count, _), _ in answers if count) < group.min_members:
                for (_, why), r in answers:
                    out[r.id] = Estimate(None, why or f"no estimate: too few members of pod group {group.name} "
                                         "could ever run here together", NO_READY_GPU)
                continue
            line.capable_gpus = max(count for (count, _), _ in answers)
        live.append(line)
    return live
