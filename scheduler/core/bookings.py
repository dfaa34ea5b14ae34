"""Bookings: capacity promised to a team for a future window, lent to others until it starts.

A `Booking` comes with the snapshot (`Snapshot.bookings`): booked reservations whose window has not
started yet (at `starts_at` the portal turns one into a pending guaranteed request, and the snapshot
no longer carries it). The cycle does three things with them (`plan`, called by `cycle.decide`):

- **Holding capacity ahead of a window.** From `starts_at - lead_s` (the team's grace) a booking's
  room is held, in its shape, on the GPUs whose clearing costs least (`clearing.clear`): nothing
  new is placed there, and the work in the way is warned (`Reclaim(kind="booking")`, due at
  `starts_at`), so that it is gone when the window starts. That is borrowed or opportunistic work;
  guaranteed work only where the model has the room in total without it but not in the booking's
  shape (whole GPUs on one node): the booking check promised the capacity, not where running work
  would leave it. The held booking counts against its team's quota from then on (`start`).
- **Placement around bookings** (`BookingScorer`, a wrapper of the cycle's scorer): bookings that
  start later are planned on the GPUs they would take (where only guaranteed work is counted; where
  that leaves no room in their shape, on the GPUs cheapest to clear), and
  work whose end (now + its known run time, `Snapshot.durations`) falls after such a window is
  kept off the booked room where it fits elsewhere, while work known to end before it fills that
  gap first (backfill).
- **At the start** (the portal keeps feeding a booking while its reservation waits, then while it
  runs): the waiting request takes the room held for it before the queue (`start`), evicting what
  is left of the work warned ahead; while its window runs it is nobody's victim
  (`ClusterState.protected`).
- The forecast takes booked capacity from the lead time on (`forecast.estimate_starts`).

Without bookings none of this runs: the cycle decides exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from .clearing import clear, room_in_total
from .engine import choose
from .fairshare import Admission, demand_of, held_by
from .filters import fits_on, nodes_with_room
from .model import MILLI, Placement, Preemption, Reason, ReasonCode, Reclaim, Request, to_milli
from .scorers import BestFitScorer, Scorer
from .state import ClusterState

DEFAULT_LEAD_S = 900.0  # warnings this long before a window when the team sets no grace
BOOKING_PRIORITY = 100  # a booking's request outranks any work when its room is planned


@dataclass(frozen=True)
class Booking:
    """A team's booked capacity: `gpu_count` GPUs of `gpu_model`, `gpu_request` of each (whole GPUs
    for several) and `gpu_memory_mib` on each, from `starts_at` to `ends_at` (seconds, the
    snapshot's clock). `lead_s`: how long before `starts_at` work in its way is warned."""

    id: str
    team: str
    gpu_model: str
    gpu_request: float = 1.0
    gpu_memory_mib: int = 0
    gpu_count: int = 1
    starts_at: float = 0.0
    ends_at: float = 0.0
    lead_s: float = DEFAULT_LEAD_S

    def __post_init__(self) -> None:
        where = f"booking {self.id}"
        if not self.gpu_model:
            raise ValueError(f"{where}: gpu_model is required")
        if self.gpu_count < 1:
            raise ValueError(f"{where}: gpu_count must be >= 1")
        if not 0 < self.gpu_request <= 1.0:
            raise ValueError(f"{where}: gpu_request {self.gpu_request} must be in (0, 1]")
        if self.gpu_count > 1 and to_milli(self.gpu_request) != MILLI:
            raise ValueError(f"{where}: a booking of {self.gpu_count} GPUs takes whole GPUs (gpu_request 1.0)")
        if self.gpu_memory_mib < 0:
            raise ValueError(f"{where}: gpu_memory_mib must not be negative")
        if self.ends_at <= self.starts_at:
            raise ValueError(f"{where}: ends_at must be after starts_at")
        if self.lead_s < 0:
            raise ValueError(f"{where}: lead_s must not be negative")

    def request(self) -> Request:
        """The booking as the engine places it (its room, not a pod)."""
        return Request(id=self.id, team=self.team, gpu_request=self.gpu_request, gpu_memory_mib=self.gpu_memory_mib,
                       gpu_count=self.gpu_count, gpu_model=self.gpu_model, priority=BOOKING_PRIORITY)

    def held_from(self) -> float:
        return self.starts_at - self.lead_s


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M")


def warning_text(booking: Booking) -> str:
    """Why work goes for a booking, as its owner reads it."""
    return f"capacity booked by team {booking.team} from {_clock(booking.starts_at)} UTC"


def _evictable(share) -> bool:
    """What a booking may move out of its way: borrowed or opportunistic work, or work already warned."""
    return share.reclaim_at is not None or share.admission in (Admission.BORROWED, Admission.OPPORTUNISTIC)


def _clear(state: ClusterState, req: Request, now: float, blocked: set[str]):
    """Where a booking whose lead has begun goes once work in its way is gone (`clearing.clear`):
    borrowed and opportunistic work first, then its own team's work (the booking counts against the
    team's quota for its window: the team's running work beyond what is left beside it is the
    team's to give up, as its priorities order its work); other teams' guaranteed work only where
    the model has the room in total without it but not in the booking's shape (GPUs on one node):
    the booking check promised the room, not where the running work would leave it."""

    def own(share) -> bool:
        return _evictable(share) or share.team == req.team

    allowed = _any if room_in_total(state, req, blocked, own) else own
    return clear(state, req, now, _evictable, allowed=allowed, blocked=blocked)


def _any(share) -> bool:
    return True


class BookedRoom:
    """Per GPU slot, the room bookings that start later are planned to take there and the earliest
    of their starts (inf where none)."""

    def __init__(self, state: ClusterState, now: float, durations: Mapping[str, float]) -> None:
        self.milli = np.zeros(state.free.shape, dtype=np.int64)
        self.mem = np.zeros(state.free.shape, dtype=np.int64)
        self.starts = np.full(state.free.shape, math.inf)
        self.now, self.durations = now, durations

    def add(self, node: int, slots: Sequence[int], req: Request, starts_at: float) -> None:
        for j in slots:
            self.milli[node, j] += req.milli
            self.mem[node, j] += req.gpu_memory_mib
            self.starts[node, j] = min(self.starts[node, j], starts_at)

    def end_of(self, req: Request) -> float:
        run = self.durations.get(req.id)
        return math.inf if run is None else self.now + float(run)

    def narrow(self, state: ClusterState, req: Request, ok: np.ndarray) -> np.ndarray:
        """The slots of `ok` this request is best placed on: off the booked room when its end falls
        after the window (or is unknown), on it when its end falls before (backfill); `ok` itself
        where no slot of the preferred kind can take it."""
        if req.gpu_count == 0:
            return ok
        need = MILLI if req.whole else req.milli
        collide = (self.milli > 0) & ((state.free - self.milli < need)
                                      | (state.mem_free - self.mem < req.gpu_memory_mib))
        if not (collide & ok).any():
            return ok
        end = self.end_of(req)
        late = collide & (end > self.starts)
        avoid = ok & ~late
        if late.any() and nodes_with_room(avoid, req).any():
            ok = avoid
        gap = ok & collide & ~late
        if gap.any() and nodes_with_room(gap, req).any():
            ok = gap
        return ok


class BookingScorer:
    """The cycle's scorer, placing around bookings (`BookedRoom.narrow`): `choose` narrows the
    feasible slots with `narrow`, then the wrapped scorer ranks what is left."""

    def __init__(self, inner: Scorer, room: BookedRoom) -> None:
        self.inner, self.room = inner, room
        self.name = inner.name

    def narrow(self, state: ClusterState, req: Request, ok: np.ndarray) -> np.ndarray:
        return self.room.narrow(state, req, ok)

    def score(self, state: ClusterState, req: Request, ok: np.ndarray, room: np.ndarray):
        return self.inner.score(state, req, ok, room)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@dataclass
class Plan:
    """What `plan` decided: the warnings for bookings about to start, where each booking goes
    (booking id -> node and slots; absent: it fits nowhere now even without the work it may move),
    and the room of later bookings for the scorer (None: no booking starts later)."""

    reclaims: list[Reclaim]
    placed: dict[str, tuple[int, tuple[int, ...]]]
    room: BookedRoom | None
    # Started bookings (their request waits in the queue): what must leave their room now.
    victims: dict[str, tuple[str, ...]] = field(default_factory=dict)
    held: dict[str, Request] = field(default_factory=dict)  # the room held now, per booking
    started: set[str] = field(default_factory=set)  # bookings whose window began and whose request waits
    now: float = 0.0


def _take(state: ClusterState, node: int, slots: Sequence[int], req: Request, sign: int = -1) -> None:
    """Hold (sign -1) or give back (+1) a booking's room on `slots`: not a share, so no quota or
    victim search sees it; free may go below zero while warned work still runs there."""
    for j in slots:
        state.free[node, j] += sign * req.milli
        state.mem_free[node, j] += sign * req.gpu_memory_mib
    state.version[node] += 1


def plan(state: ClusterState, bookings: Sequence[Booking], now: float,
         durations: Mapping[str, float] | None = None, claimed: set[str] | None = None,
         started: Container[str] = ()) -> Plan:
    """Hold the room of bookings whose lead time has begun (in `state`, for the rest of the cycle)
    and warn what is in its way; plan later bookings on the GPUs they would take. `claimed`: victims
    already promised this cycle (the fair queue's), which others must not count on; the bookings'
    victims are added to it. `started`: the waiting requests, among which a booking whose window
    began waits (the portal made it a pending reservation of the same id, and keeps feeding the
    booking until it is placed): its room is held for it and its victims listed (`start`)."""
    out = Plan([], {}, None, now=now)
    live = sorted((b for b in bookings if b.ends_at > now and b.gpu_model in state.model_id),
                  key=lambda b: (b.starts_at, b.id))
    running = {b.id for b in live if b.id in state.placed}
    state.protected |= running  # a window that runs is kept to its end: nobody's victim
    live = [b for b in live if b.id not in running]
    if not live:
        return out
    claimed = claimed if claimed is not None else set()
    fit = BestFitScorer()
    for b in (b for b in live if b.held_from() <= now):
        if b.id in started:
            out.started.add(b.id)
        req = b.request()
        choice = choose(state, req, fit)
        if choice is not None:
            _take(state, choice.node, choice.slots, req)
            out.placed[b.id] = (choice.node, choice.slots)
            out.held[b.id] = req
            if b.id in started:
                out.victims[b.id] = ()
            continue
        found = _clear(state, req, now, claimed | state.protected | state.reserved_now)
        if found is None:
            continue  # guaranteed work fills its model: it waits for that to end, as any request
        choice, victims, released = found
        for h in released:
            state.restore(h)  # they run until the window starts
        _take(state, choice.node, choice.slots, req)
        out.placed[b.id] = (choice.node, choice.slots)
        out.held[b.id] = req
        claimed.update(victims)
        if b.id in started:
            out.victims[b.id] = victims  # its request takes them now (they were warned when the lead began)
            continue
        if not victims:
            continue
        due = {v: min(state.placed[v].share.reclaim_at or b.starts_at, b.starts_at) for v in victims}
        text = warning_text(b)
        out.reclaims.append(Reclaim(b.id, victims, due, (Reason(ReasonCode.NO_FIT, text, len(victims)),), "booking"))
    later = [b for b in live if b.held_from() > now]
    if not later:
        return out
    # Later bookings: where they would go if only guaranteed work stayed (what they may move goes
    # by then), taken in start order so that two bookings never plan on the same room.
    gone = [state.release(rid) for rid, h in list(state.placed.items()) if _evictable(h.share)]
    room = BookedRoom(state, now, durations or {})
    taken: list[tuple[int, tuple[int, ...], Request]] = []
    for b in later:
        req = b.request()
        choice = choose(state, req, fit)
        if choice is None:
            # guaranteed work sits where the booking's shape would go: plan it where the least of
            # it runs, so that new work keeps off and less of it is in the way at the lead time
            found = clear(state, req, now, _evictable, allowed=_any, blocked=state.protected)
            if found is None:
                continue
            choice = found[0]
            for h in found[2]:
                state.restore(h)
        _take(state, choice.node, choice.slots, req)
        taken.append((choice.node, choice.slots, req))
        out.placed[b.id] = (choice.node, choice.slots)
        room.add(choice.node, choice.slots, req, b.starts_at)
    for node, slots, req in taken:
        _take(state, node, slots, req, +1)
    for h in gone:
        state.restore(h)
    out.room = room if taken else None
    return out


def start(state: ClusterState, booked: Plan, pending: Sequence[Request], fair=None) -> Iterator[Preemption | tuple]:
    """Place the waiting requests of started bookings in the room held for them, before the queue:
    what is left there of the work warned ahead of the window goes now (a `Preemption`). Counted as
    guaranteed: the booking check kept its team's quota for the window. A request that does not fit
    its room even so (its pod asks for more node CPU or memory than the booking), or that has no
    room held, clears room for itself now by the same rules (`_clear`); where none can be cleared,
    it is left to the queue.

    A booking whose room is held ahead of its window counts against its team's quota from then on
    (charged as guaranteed in the cycle's ledger): the team's work placed meanwhile that would run
    into the window is admitted within what the quota leaves beside the booking (beyond it, it
    borrows and may be reclaimed), so that the window does not take the team over its quota."""
    if fair is not None:
        for bid, req in booked.held.items():
            if bid not in booked.victims:  # not started: its request is charged when it is placed
                node, slots = booked.placed[bid]
                fair.ledger.charge(bid, req.team, state.model_at(node, slots[0]), demand_of(req), Admission.GUARANTEED)
    claimed = fair.claimed if fair is not None else set()
    for req in pending:
        if req.id not in booked.started:
            continue
        where = booked.placed.get(req.id)
        victims: tuple[str, ...] = ()
        if where is not None:
            node, slots = where
            victims = booked.victims[req.id]
            _take(state, node, slots, booked.held[req.id], +1)
            released = [fair.release(v) if fair is not None else state.release(v) for v in victims]
            if fits_on(state, req, node, slots):
                yield _place(state, req, node, slots, victims, fair)
                continue
            for h in released:
                state.restore(h)
                if fair is not None:
                    fair.ledger.charge(h.share.reservation_id, h.share.team, state.model_at(h.node, h.gpus[0]),
                                       held_by(h.share, len(h.gpus)), Admission(h.share.admission))
        # Its pod needs more than the booking held (node CPU or memory), or nothing was held: the
        # request itself clears its room now, by the same rules, rather than wait for the queue.
        found = _clear(state, req, booked.now, (claimed - set(victims)) | state.protected | state.reserved_now)
        if found is None:
            continue  # left to the queue
        choice, victims, _ = found
        if fair is not None:
            for v in victims:
                fair.ledger.refund(v)
        claimed.update(victims)
        yield _place(state, req, choice.node, choice.slots, victims, fair)


def _place(state: ClusterState, req: Request, node: int, slots: Sequence[int], victims: tuple[str, ...],
           fair) -> Preemption | tuple:
    state.reserve(req, node, slots, admission=str(Admission.GUARANTEED))
    if fair is not None:
        fair.ledger.charge(req.id, req.team, state.model_at(node, slots[0]), demand_of(req), Admission.GUARANTEED)
    placement = placement_of(state, req, node, slots)
    return Preemption(req.id, victims, placement) if victims else (placement,)


def placement_of(state: ClusterState, req: Request, node: int, slots: Sequence[int]) -> Placement:
    return Placement(request_id=req.id, node=state.node_names[node],
                     gpu_uuids=tuple(state.gpu_uuids[node][j] for j in slots),
                     gpu_indexes=tuple(state.gpu_indexes[node][j] for j in slots),
                     gpu_request=req.gpu_request, gpu_memory_mib=req.gpu_memory_mib,
                     group=req.group.name if req.group else None, admission=str(Admission.GUARANTEED))
