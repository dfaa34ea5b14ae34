"""The scheduling cycle: queue sort -> per request (or gang) filter, score, reserve -> decisions.

Reservations live in the cycle's ClusterState only; binding them is the caller's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .bookings import BookingScorer, plan
from .bookings import start as start_bookings
from .engine import Choice, choose, make_scorer
from .fairqueue import MIN_RUN_S, Fair
from .fairshare import Admission
from .filters import explain, feasible, nodes_with_room
from .fragmentation import TypicalPod, typical_pods
from .model import (
    CycleResult,
    GpuCandidate,
    Placement,
    Preemption,
    Reason,
    ReasonCode,
    Reclaim,
    Request,
    Snapshot,
    Unschedulable,
)
from .preemption import find_preemption
from .queue import DEFAULT_AGING_S, queue_order
from .scorers import Scorer
from .segregation import NodeKinds, placement_tier
from .state import ClusterState

ZONE_LABELS = ("topology.kubernetes.io/rack", "rack", "topology.kubernetes.io/zone", "zone")


def cycle_workload(snapshot: Snapshot, pending: Iterable[Request]) -> list[Request]:
    """The requests FGD-style policies plan for (typical_pods counts their shapes): what runs now
    plus what waits. A running share is one entry per share, one Request per shape: building and
    validating a Request per share cost more than the rest of a capacity preview."""
    out = list(pending)
    shapes: dict[tuple[float, str], Request] = {}
    for node in snapshot.nodes:
        for gpu in node.gpus:
            for s in gpu.shares:
                shape = shapes.get((s.gpu_request, gpu.model))
                if shape is None:
                    shape = shapes[(s.gpu_request, gpu.model)] = Request(
                        id=s.reservation_id, gpu_request=s.gpu_request, gpu_model=gpu.model)
                out.append(shape)
    return out


def _placement(state: ClusterState, req: Request, choice: Choice, admission: str = "guaranteed") -> Placement:
    i = choice.node
    return Placement(
        request_id=req.id,
        node=state.node_names[i],
        gpu_uuids=tuple(state.gpu_uuids[i][j] for j in choice.slots),
        gpu_indexes=tuple(state.gpu_indexes[i][j] for j in choice.slots),
        gpu_request=req.gpu_request if req.gpu_count else 0.0,
        gpu_memory_mib=req.gpu_memory_mib,
        score=choice.score,
        group=req.group.name if req.group else None,
        admission=admission,
    )


def _closeness(state: ClusterState, group: str) -> np.ndarray:
    """Tier per node for a gang member: 2 where the gang already is, 1 in the same rack/zone, else 0."""
    tier = np.zeros(len(state.node_names), dtype=np.int64)
    nodes = state.group_nodes.get(group)
    if not nodes:
        return tier
    zones = set()
    for i in nodes:
        labels = state.node_labels[i]
        zones |= {(k, labels[k]) for k in ZONE_LABELS if k in labels}
    if zones:
        for i, labels in enumerate(state.node_labels):
            if any(labels.get(k) == v for k, v in zones):
                tier[i] = 1
    for i in nodes:
        tier[i] = 2
    return tier


def schedule(
    snapshot: Snapshot,
    pending: Sequence[Request],
    policy: str = "tessera",
    *,
    preemption: bool = True,
    typical: Sequence[TypicalPod] | None = None,
    seed: int = 0,
    aging_s: float = DEFAULT_AGING_S,
    min_run_s: float = MIN_RUN_S,
    evictions: Mapping[str, Sequence[float]] | None = None,
    node_hold: bool = False,
    keep_apart: bool = False,
) -> CycleResult:
    """Decide for every pending request: a placement, a preemption, or reasons it waits."""
    placements: list[Placement] = []
    preemptions: list[Preemption] = []
    refused: list[Unschedulable] = []
    reclaims: list[Reclaim] = []
    for decision in decide(snapshot, pending, policy, preemption=preemption, typical=typical, seed=seed,
                           aging_s=aging_s, min_run_s=min_run_s, evictions=evictions, node_hold=node_hold,
                           keep_apart=keep_apart):
        if isinstance(decision, Preemption):
            preemptions.append(decision)
        elif isinstance(decision, Reclaim):
            reclaims.append(decision)
        elif isinstance(decision, Unschedulable):
            refused.append(decision)
        else:
            placements.extend(decision)
    return CycleResult(policy, tuple(placements), tuple(preemptions), tuple(refused), tuple(reclaims))


Decision = tuple[Placement, ...] | Preemption | Reclaim | Unschedulable


def decide(
    snapshot: Snapshot,
    pending: Sequence[Request],
    policy: str = "tessera",
    *,
    preemption: bool = True,
    typical: Sequence[TypicalPod] | None = None,
    seed: int = 0,
    aging_s: float = DEFAULT_AGING_S,
    min_run_s: float = MIN_RUN_S,
    evictions: Mapping[str, Sequence[float]] | None = None,
    node_hold: bool = False,
    keep_apart: bool = False,
) -> Iterator[Decision]:
    """`schedule`, one decision at a time in queue order, as soon as it is made: a tuple of
    placements (one request, or the members of a pod group that go together), a Preemption, a
    Reclaim, or an Unschedulable. A caller can act on the first decisions while later ones are
    still computed. Under a quota tree, `min_run_s` and `evictions` (running reservation → when it
    was evicted before) ration evictions for takers that are not guaranteed, and `node_hold` lets a
    multi-GPU request that fits nowhere hold a node (`fairqueue.Fair.hold`; off by default: in the
    replay it doubled evictions for no gain in fairness), and `keep_apart` places by what nodes hold
    (`segregation.placement_tier`; off by default: in the replay it added evictions on two seeds of
    three)."""
    ids = [r.id for r in pending]
    if len(set(ids)) != len(ids):
        raise ValueError("pending requests repeat an id")
    state = ClusterState.from_snapshot(snapshot)
    scorer = make_scorer(
        policy, state, typical if typical is not None else typical_pods(cycle_workload(snapshot, pending)), seed
    )
    running = set(state.placed)
    for req in pending:
        if req.id in running:
            msg = f"request {req.id} already holds a share in the snapshot"
            yield Unschedulable(req.id, (Reason(ReasonCode.INVALID, msg),))
    waiting = [r for r in pending if r.id not in running]
    decided: set[str] = set()  # gang members decided with their gang
    gangs: dict[str, list[Request]] = {}
    for r in waiting:
        if r.group is not None:
            gangs.setdefault(r.group.name, []).append(r)
    if snapshot.quotas is not None:
        fair = Fair(state, snapshot.quotas, waiting, snapshot.now, snapshot.past_use, aging_s,
                    min_run_s=min_run_s, evictions=evictions, keep_apart=keep_apart)
        ordered: Iterable[Request] = fair.order(waiting, decided)
    else:
        fair = None
        ordered = queue_order(waiting, snapshot.teams, snapshot.now, aging_s)
    if snapshot.bookings:
        booked = plan(state, snapshot.bookings, snapshot.now, snapshot.durations,
                      fair.claimed if fair is not None else None, started={r.id for r in waiting})
        yield from booked.reclaims
        for decision in start_bookings(state, booked, waiting, fair):
            decided.add(decision.request_id if isinstance(decision, Preemption) else decision[0].request_id)
            yield decision
        if booked.room is not None:
            scorer = BookingScorer(scorer, booked.room)
    for req in ordered:
        if req.id in decided:
            continue
        if req.group is not None:
            members = queue_order([r for r in gangs[req.group.name] if r.id not in decided],
                                  snapshot.teams, snapshot.now, aging_s)
            decided.update(r.id for r in members)
            gang_placed, gang_refused = place_gang(state, scorer, members, fair)
            if gang_placed:
                yield tuple(gang_placed)
            yield from gang_refused
            continue
        if fair is not None:
            yield _decide_fair(state, scorer, fair, req, preemption, node_hold)
            continue
        choice = choose(state, req, scorer)
        if choice is not None:
            state.reserve(req, choice.node, choice.slots)
            yield (_placement(state, req, choice),)
            continue
        reasons = tuple(explain(state, req))
        if preemption and req.priority > 0:
            found = find_preemption(state, req)
            if found is not None:
                choice, victims, _ = found
                state.reserve(req, choice.node, choice.slots)
                yield Preemption(req.id, victims, _placement(state, req, choice))
                continue
        yield Unschedulable(req.id, reasons)


def _decide_fair(state: ClusterState, scorer: Scorer, fair: Fair, req: Request, preemption: bool,
                 node_hold: bool = False) -> Decision:
    choice, got = fair.try_place(req, scorer)
    if choice is not None:
        return (_placement(state, req, choice, str(got)),)
    reasons = tuple(got)
    if not preemption:
        return Unschedulable(req.id, reasons)
    found = fair.preempt(req)
    kind = "quota"
    if found is None:
        held = fair.hold(req) if node_hold else None
        if held is None:
            return Unschedulable(req.id, reasons)
        node, found = held
        kind = "node_hold"
        if found is None:
            text = (f"holding node {state.node_names[node]} for it: nothing new is placed there until the work it "
                    f"may not take there ends")
            return Reclaim(req.id, (), {}, (Reason(ReasonCode.NO_FIT, text), *reasons), kind)
    choice, victims, admission, due = found
    if not due:
        return Preemption(req.id, victims, _placement(state, req, choice, str(admission)))
    if kind != "node_hold" and admission != Admission.GUARANTEED:
        kind = "fair_share"
    if req.gpu_count > 1 and node_hold:  # its node is kept for it while the victims' grace runs
        fair.held[choice.node] = True
        borrowed = sum(1 for v in victims if state.placed[v].share.admission == Admission.BORROWED)
        text = (f"holding node {state.node_names[choice.node]} for it; {borrowed} borrowed shares there are being "
                f"reclaimed")
        reasons = (Reason(ReasonCode.NO_FIT, text, borrowed), *reasons)
    return Reclaim(req.id, victims, due, reasons, kind)

def place_gang(
    state: ClusterState, scorer: Scorer, members: list[Request], fair: Fair | None = None
) -> tuple[list[Placement], list[Unschedulable]]:
    """Place a pod group's members close together; keep them only if enough fit, else roll back."""
    group = members[0].group
    assert group is not None
    running = state.group_held[group.name]
    need = max(0, group.min_members - running)
    placed: list[tuple[Request, Choice, str]] = []
    failures: dict[str, tuple[Reason, ...]] = {}
    for req in members:
        tier = _closeness(state, group.name)
        if fair is not None:
            choice, got = fair.try_place(req, scorer, tier=tier)
            if choice is None:
                failures[req.id] = tuple(got)
                continue
            placed.append((req, choice, str(got)))
            continue
        choice = choose(state, req, scorer, tier=tier)
        if choice is None:
            failures[req.id] = tuple(explain(state, req))
            continue
        state.reserve(req, choice.node, choice.slots)
        placed.append((req, choice, "guaranteed"))
    if len(placed) >= need and placed:
        # Enough members run together; the others wait with their own reasons.
        waiting = [Unschedulable(r.id, failures[r.id]) for r in members if r.id in failures]
        return [_placement(state, r, c, a) for r, c, a in placed], waiting
    for req, _, _ in placed:  # all or nothing: give back the partial reservations
        if fair is not None:
            fair.release(req.id)
        else:
            state.release(req.id)
    msg = f"pod group {group.name}: {len(placed)} of the {need} members needed now could be placed together"
    gang = Reason(ReasonCode.GANG_INCOMPLETE, msg, len(placed))
    return [], [Unschedulable(r.id, (gang, *failures.get(r.id, ()))) for r in members]


def feasible_gpus(
    snapshot: Snapshot, request: Request, policy: str = "tessera", typical: Sequence[TypicalPod] | None = None
) -> tuple[list[GpuCandidate], list[Reason]]:
    """Where `request` could go now (best first) and why the other GPUs were refused."""
    candidates, _, reasons = best_gpus(snapshot, request, None, policy, typical)
    return candidates, reasons


def best_gpus(
    snapshot: Snapshot, request: Request, limit: int | None, policy: str = "tessera",
    typical: Sequence[TypicalPod] | None = None,
) -> tuple[list[GpuCandidate], int, list[Reason]]:
    """The first `limit` (None: all) of feasible_gpus' candidates, how many there are in all, and
    the reasons. Only the candidates asked for are built: a capacity preview on 4,000 free GPUs
    wants the best hundred and the count."""
    state = ClusterState.from_snapshot(snapshot)
    return _best(snapshot, state, request, limit, policy, typical)


@dataclass(frozen=True)
class Judgement:
    """What the cycle would do with one request alone now: how it would count against quotas
    (`admission`; None: it would wait), where it would go (best first, `count` in all), why not
    sooner or elsewhere, and whether it can never run as asked (`never`)."""

    admission: Admission | None
    candidates: list[GpuCandidate]
    count: int
    reasons: list[Reason]
    never: bool = False


def judge(snapshot: Snapshot, request: Request, limit: int | None = None, policy: str = "tessera",
          typical: Sequence[TypicalPod] | None = None, *, keep_apart: bool = False) -> Judgement:
    """The cycle's decision for `request` as if it were the only one waiting, without preemption:
    the same quota verdicts (`Fair.verdicts`) and the same filters and scoring. The request page's
    preview and the capacity API answer with it."""
    state = ClusterState.from_snapshot(snapshot)
    if snapshot.quotas is None:
        candidates, count, reasons = _best(snapshot, state, request, limit, policy, typical)
        return Judgement(Admission.GUARANTEED if candidates else None, candidates, count, reasons)
    fair = Fair(state, snapshot.quotas, (), snapshot.now, snapshot.past_use)
    groups, quota_reasons, never = fair.verdicts(request)
    models = fair.models_of(request)
    for admission in (Admission.GUARANTEED, Admission.BORROWED, Admission.OPPORTUNISTIC):
        chosen = groups.get(admission)
        if not chosen:
            continue
        mask = None if len(chosen) == len(models) else state.model_mask(frozenset(chosen))
        # With `keep_apart`, the nodes the cycle (`decide(keep_apart=True)`) would prefer first.
        tier = placement_tier(NodeKinds(state), admission) if keep_apart else None
        candidates, count, reasons = _best(snapshot, state, request, limit, policy, typical, mask, tier)
        if candidates:
            return Judgement(admission, candidates, count, quota_reasons + reasons)
    _, _, reasons = _best(snapshot, state, request, 0, policy, typical) if any(groups) else (None, 0, [])
    return Judgement(None, [], 0, quota_reasons + reasons, never)


def _best(snapshot: Snapshot, state: ClusterState, request: Request, limit: int | None, policy: str,
          typical: Sequence[TypicalPod] | None, mask: np.ndarray | None = None, tier: np.ndarray | None = None
          ) -> tuple[list[GpuCandidate], int, list[Reason]]:
    ok = feasible(state, request)
    if mask is not None:
        ok = ok & mask
    room = nodes_with_room(ok, request)
    reasons = explain(state, request)
    if not room.any() or limit == 0:
        return [], 0, reasons
    scorer = make_scorer(
        policy, state, typical if typical is not None else typical_pods(cycle_workload(snapshot, [request]))
    )
    scores, _ = scorer.score(state, request, ok, room)
    nodes = np.flatnonzero(room)
    # Best node first (by `tier` first where given, as the cycle compares it), ties by the fixed
    # tie rank; within a node its GPUs in slot order.
    keys = (state.tie_rank[nodes], -scores[nodes]) + ((-tier[nodes],) if tier is not None else ())
    order = nodes[np.lexsort(keys)]
    count = int(ok[nodes].sum())
    out: list[GpuCandidate] = []
    for i in order.tolist():
        name, uuids, indexes, score = state.node_names[i], state.gpu_uuids[i], state.gpu_indexes[i], float(scores[i])
        free, mem_free, model = state.free[i].tolist(), state.mem_free[i].tolist(), state.gpu_model[i].tolist()
        for j in np.flatnonzero(ok[i]).tolist():
            if limit is not None and len(out) >= limit:
                return out, count, reasons
            out.append(GpuCandidate(node=name, gpu_uuid=uuids[j], gpu_index=indexes[j], model=state.models[model[j]],
                                    free_share=free[j] / 1000.0, free_memory_mib=mem_free[j], score=score))
    return out, count, reasons
