"""The forecast's walk: the waiting lines run forward over the ends, as the cycle would admit them."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..cycle import place_gang
from ..engine import choose
from ..model import MILLI, Request
from ..scorers import BestFitScorer, Scorer
from ..state import ClusterState
from .answers import (
    AFTER_ENDS,
    EVENT_BUDGET,
    NO_READY_GPU,
    NOW,
    POD_GROUP,
    QUOTA,
    UNKNOWN_ENDS,
    Estimate,
    Evictable,
    fits_in,
    models_text,
    names,
    room_at_last,
)
from .drains import Drains
from .hooks import Gate, Order
from .lines import Index, Line, Summary, might_fit, model_ids, most_free, need_of, shape_of
from .preemption import EvictableRoom, evictable_room, might_preempt, preempt_on

MAX_PREEMPT_NODES = 32  # an arriving request looks for victims on at most this many nodes
WhyOf = Callable[[int], str]  # node -> why a request starts there now ("" at `now`)


class Walk:
    def __init__(self, state: ClusterState, scorer: Scorer, *, gate: Gate | None, order: Order | None,
                 durations: Mapping[str, float], preemption: bool, max_events: int,
                 requeue: Mapping[str, Request] | None = None) -> None:
        self.state, self.scorer, self.gate, self.order = state, scorer, gate, order
        # Evicted work waits again, as the cycle has it (running id -> its request; None: it vanishes).
        self.requeue = requeue
        self.requeued: set[str] = set()  # evicted in the forecast and waiting again
        self.kept: set[str] = set()  # of those, requests of the queue (their first start is their estimate)
        self.requests: dict[str, Request] = {}  # placed in the forecast
        self.end_at: dict[str, float] = {}  # evicted and placed again: its new end (earlier ones are stale)
        self.durations, self.preemption, self.max_events = durations, preemption, max_events
        self.out: dict[str, Estimate] = {}
        self.events: list[tuple[float, int, str]] = []  # (time, sequence, reservation id that ends)
        self.seq = itertools.count()
        self.forecast_ids: set[str] = set()  # placed by the forecast itself
        self.unending: list[int] = []  # nodes of forecast placements without a duration
        self.node_models = [frozenset(row[row >= 0].tolist()) for row in state.gpu_model]
        # node -> reservations on it, in the order they were placed (a dict: the same order every run)
        self.on_node: dict[int, dict[str, None]] = {}
        for rid, rec in state.placed.items():
            self.on_node.setdefault(rec.node, {})[rid] = None
        # At the current time: nodes placed on; nodes where a share with a priority ended (room any
        # guarantee request may now use); nodes where a team placed shares with a priority.
        self.placed_at: set[int] = set()
        self.freed_guaranteed: set[int] = set()
        self.team_placed: dict[int, set[str]] = {}
        self.index = Index([])
        self.always: list[Line] = []
        self.live: list[Line] = []
        self.arrive: Mapping[str, float] = {}  # expected arrivals: id -> when it joins the queue
        self.line_of: dict[str, Line] = {}  # expected arrival -> its line
        self.real_placed = 0  # requests of the queue (not expected arrivals) placed so far
        # Per GPU model: (expected arrivals, requests of the queue) placed on it so far; and per
        # request of the queue placed, those counts just before it: what took the room ahead of it.
        # Placed at the current time are not counted (they did not take room before it).
        self.taken: dict[int, tuple[int, int]] = {}
        self.taken_at: tuple[float, dict[int, tuple[int, int]]] = (-1.0, {})  # the counts as the current time began
        self.ahead: dict[str, tuple[int, int, int]] = {}  # request -> (model id, expected, of the queue)
        # Per priority, the compute shares of it hold per GPU slot, never less than they hold now
        # (a placement adds, an end does not take away): where an arrival could find victims.
        self.held_by: dict[int, np.ndarray] = {}
        # Bookings whose room is not held yet (bookings.Booking, by id): each takes its room when
        # its lead time begins (an event then), or at the first time after that it fits, before
        # any waiting request is tried, and gives it back at its end.
        self.bookings: dict[str, Any] = {}
        self.booking_due: list[Any] = []
        # Planned drains: each node's readiness over the walk, and the events where one may change
        # (event id -> node).
        self.drains: Drains | None = None
        self.drain_events: dict[str, int] = {}

    def plan_drains(self, drains: Drains, now: float) -> None:
        """The nodes' readiness at `now` under the planned drains, and an event wherever it may change."""
        self.drains = drains
        drains.apply(self.state, now)
        for k, (t, i) in enumerate(drains.times(now)):
            rid = f"\0drain:{k}"
            self.drain_events[rid] = i
            heapq.heappush(self.events, (t, next(self.seq), rid))

    # ---- changes ------------------------------------------------------------------------------
    def release(self, rid: str) -> int:
        """End (or evict) a reservation in the forecast; the node it was on."""
        rec = self.state.release(rid)
        self.on_node[rec.node].pop(rid, None)
        if rec.share.priority > 0:
            self.freed_guaranteed.add(rec.node)
        if self.gate is not None:
            self.gate.refund(rid)
        if self.order is not None and self.order is not self.gate:
            self.order.refund(rid)
        return rec.node

    def placed(self, req: Request, t: float, why: str) -> None:
        """`req` was reserved in the state at `t`: its estimate, and what follows from it."""
        state = self.state
        rec = state.placed[req.id]
        self.on_node.setdefault(rec.node, {})[req.id] = None
        self.placed_at.add(rec.node)
        if req.priority > 0:
            self.team_placed.setdefault(rec.node, set()).add(req.team)
        if req.id not in self.kept:
            self.out[req.id] = Estimate(t, why or "it fits now", AFTER_ENDS if why else NOW)
        model = state.model_at(rec.node, rec.gpus[0]) if rec.gpus else ""
        if self.gate is not None:
            self.gate.charge(req, model)
        if self.order is not None and self.order is not self.gate:
            self.order.charge(req, model)
        self.forecast_ids.add(req.id)
        if self.requeue is not None:
            self.requests[req.id] = req
        self._hold(rec)
        expected = req.id in self.arrive or req.id in self.requeued
        if not expected:
            self.real_placed += 1
        if rec.gpus:
            if self.taken_at[0] != t:
                self.taken_at = (t, dict(self.taken))
            m = int(state.gpu_model[rec.node, rec.gpus[0]])
            if self.arrive and not expected:
                self.ahead[req.id] = (m, *self.taken_at[1].get(m, (0, 0)))
            exp, real = self.taken.get(m, (0, 0))
            self.taken[m] = (exp + expected, real + (not expected))
        run = self.durations.get(req.id)
        if run is not None:
            heapq.heappush(self.events, (t + max(0.0, float(run)), next(self.seq), req.id))
            if req.id in self.requeued:
                self.end_at[req.id] = t + max(0.0, float(run))
        else:
            self.unending.append(rec.node)

    def wait_again(self, rid: str, t: float) -> None:
        """An evicted reservation back in the queue with its first submission (its age ranks it):
        a line of its own, tried after every end like the lines with affinity."""
        if self.requeue is None:
            return
        rec_req = self.requeue.get(rid) or self.requests.get(rid)
        if rec_req is None or rec_req.group is not None:  # unknown, or a pod group's member: it vanishes
            return
        self.requeued.add(rid)
        if rid in self.out:  # a request of the queue placed earlier in the forecast: its estimate stands
            self.kept.add(rid)
        line = Line(deque([(-1, rec_req)]), model_ids(self.state, rec_req), True, need=need_of(rec_req),
                    fit=shape_of(rec_req, False), team=rec_req.team, priority=rec_req.priority)
        line.capable_gpus = 1
        self.always.append(line)
        self.live.append(line)

    def _hold(self, rec) -> None:
        held = self.held_by.get(rec.share.priority)
        if held is None:
            held = self.held_by[rec.share.priority] = np.zeros_like(self.state.free)
        for j in rec.gpus:
            held[rec.node, j] += rec.milli

    def hold_bookings(self) -> None:
        """Take the room of the bookings whose lead time has begun, where it fits now (the cycle
        holds it then, and moves what may be moved out of its way by the window's start)."""
        left = []
        for b in self.booking_due:
            req = b.request()
            choice = choose(self.state, req, BestFitScorer())
            if choice is None:
                left.append(b)
                continue
            self.state.reserve(req, choice.node, choice.slots)
            self.on_node.setdefault(choice.node, {})[req.id] = None
            heapq.heappush(self.events, (b.ends_at, next(self.seq), req.id))
        self.booking_due = left

    def victims_near(self, req: Request) -> list[int]:
        """The ready nodes where `req` (just arrived) might find victims, at most MAX_PREEMPT_NODES,
        those with the most evictable compute first: enough GPUs of its models whose free compute
        plus what lower priorities hold covers it (a necessary condition of the cycle's rule)."""
        st = self.state
        room = st.free.copy()
        for p, held in self.held_by.items():
            if p < req.priority:
                room += held
        ok = (room >= (MILLI if req.whole else req.milli)) & st.ready[:, None]
        if req.gpu_model is not None:
            ok &= st.model_mask(req.gpu_model)
        nodes = np.flatnonzero(ok.sum(axis=1) >= req.gpu_count)
        if nodes.size > MAX_PREEMPT_NODES:
            most = (room * ok)[nodes].sum(axis=1)
            nodes = nodes[np.argsort(-most, kind="stable")[:MAX_PREEMPT_NODES]]
        return sorted(nodes.tolist())

    def narrow(self, line: Line, req: Request) -> Request | None:
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

    def try_head(self, line: Line, t: float, why_of: WhyOf) -> list[int]:
        """Place the line's first request (or its pod group) at `t`; the nodes it took (none: it waits)."""
        if line.group is not None:
            return self._try_group(line, t, why_of)
        _, req = line.head
        use = self.narrow(line, req)
        if use is None:
            return []
        choice = choose(self.state, use, self.scorer)
        if choice is None:
            return []
        line.quota_limited = False
        self.state.reserve(req, choice.node, choice.slots)
        line.waiting.popleft()
        self.placed(req, t, why_of(choice.node))
        return [choice.node]

    def _try_group(self, line: Line, t: float, why_of: WhyOf) -> list[int]:
        members = [use for _, req in line.waiting if (use := self.narrow(line, req)) is not None]
        if not members:
            return []
        done, _ = place_gang(self.state, self.scorer, members)  # the cycle's own rule for pod groups
        if not done:
            return []
        ids = {p.request_id for p in done}
        originals = {r.id: r for _, r in line.waiting}
        line.waiting = deque((pos, r) for pos, r in line.waiting if r.id not in ids)
        for p in done:
            self.placed(originals[p.request_id], t, why_of(self.state.placed[p.request_id].node))
        return [self.state.placed[p.request_id].node for p in done]

    def summary(self, i: int) -> Summary:
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

    def arrived(self, line: Line, t: float) -> bool:
        """Whether the line's first request is in the queue at `t` (an expected arrival may not be yet)."""
        return self.arrive.get(line.head[1].id, t) <= t

    def rank(self, line: Line, t: float) -> Any:
        return line.head[0] if self.order is None else self.order.key(line.head[1], t)

    # ---- admission ----------------------------------------------------------------------------
    def admit(self, t: float, candidates: list[Line], why_of: WhyOf, local: dict[int, Summary] | None = None,
              anywhere: frozenset[int] = frozenset()) -> None:
        """Try the candidate lines' requests in queue order while they start. With `local` (the
        summaries of the nodes where something just ended), a line not in `anywhere` (by id) can only
        fit there: it is tried only while its shape may fit on one of them. Lines of one shape fit or
        fail alike (without a gate, which answers per request): a shape that fails at `t` is not
        tried again at `t`, room only shrinking meanwhile."""
        alike = self.gate is None
        groups: dict[object, list[Line]] = {}
        for line in candidates:
            if line.waiting:
                single = line.group is not None or line.always or id(line) in anywhere or not alike
                groups.setdefault(id(line) if single else line.fit, []).append(line)

        def best(key: object) -> tuple[Any, Line] | None:
            lines = groups[key] = [line for line in groups[key] if line.waiting]
            return min(((self.rank(line, t), line) for line in lines if self.arrived(line, t)), key=lambda x: x[0],
                       default=None)

        heap = [(first[0], k, key, first[1]) for k, key in enumerate(groups) if (first := best(key)) is not None]
        heapq.heapify(heap)
        most = most_free(local) if local is not None else 0
        dirty = False  # the candidates passed `select`'s room check; after a start, check again
        while heap:
            _, k, key, line = heapq.heappop(heap)
            if (dirty and local is not None and line.group is None and not line.always
                    and id(line) not in anywhere
                    and ((line.need[1] and line.need[0] > most) or not might_fit(line.need, line.models,
                                                                                  local.values()))):
                continue
            took = self.try_head(line, t, why_of)
            if not took:
                continue  # a shape (or a single line) that fails at `t` is not tried again at `t`
            dirty = True
            if local is not None:
                for i in took:
                    if i in local:
                        local[i] = self.summary(i)
                most = most_free(local)
            nxt = best(key)
            if nxt is not None:
                heapq.heappush(heap, (nxt[0], k, key, nxt[1]))

    def select(self, nodes: list[int], ended: bool) -> tuple[list[Line], dict[int, Summary], set[int]]:
        """Lines to try after room appeared on `nodes` (and, with a gate, after any end), the
        summaries of those nodes, and the ids of lines that may now fit anywhere."""
        chosen = [line for line in self.always if line.waiting]
        anywhere = {id(line) for line in chosen}
        local: dict[int, Summary] = {}
        if nodes:
            local = {i: self.summary(i) for i in nodes}
            seen = set(anywhere)
            top: dict[int, int] = {}
            for _, _, per in local.values():
                for m, (most, _, _) in per.items():
                    top[m] = max(top.get(m, 0), most)
            for shape in self.index.candidates(top):
                if might_fit(shape.need, shape.models, local.values()):
                    for line in shape.lines:
                        if line.waiting and id(line) not in seen:
                            seen.add(id(line))
                            chosen.append(line)
        if self.gate is not None and ended:  # a line the gate had narrowed may use more models: anywhere
            for line in self.live:
                if (line.waiting and line.last_allowed is not None and id(line) not in anywhere
                        and self.gate.allowed(line.head[1]) != line.last_allowed):
                    if line not in chosen:
                        chosen.append(line)
                    anywhere.add(id(line))
        return chosen, local, anywhere

    # ---- preemption ---------------------------------------------------------------------------
    def preempt(self, t: float, why_of: WhyOf) -> list[int]:
        """Guarantee requests that may now evict lower-priority work, as the cycle would; the nodes
        where something was evicted. The cycle found no preemption before; one can be new only
        where a share with a priority ended (what any guarantee request may use grew: the room of a
        priority-0 share that ends was evictable already) or, for a team, where it placed shares
        with a priority (which its higher priorities may evict)."""
        state = self.state
        freed = {i for i in self.freed_guaranteed if state.ready[i]}
        placed = {i: teams for i, teams in self.team_placed.items() if state.ready[i]}
        nodes = sorted(freed | set(placed))
        if not nodes:
            return []
        rooms = {i: evictable_room(state, i, self.on_node) for i in nodes}
        anyone_rooms = [rooms[i] for i in sorted(freed)]
        # Per team: the nodes where its own shares are new to it, and the lowest priority among them
        # (a line at or below it has nothing of its own to evict there).
        team_rooms: dict[str, list] = {}
        lowest: dict[str, int] = {}
        for i in nodes:
            for team in sorted(rooms[i].own) if i in freed else sorted(placed.get(i, ())):
                recs = rooms[i].own.get(team, ())
                if recs:
                    team_rooms.setdefault(team, []).append(rooms[i])
                    lowest[team] = min(lowest.get(team, 101), *(rec.share.priority for rec in recs))
        top: dict[int, int] = {}  # per model, the most compute one GPU could have after evictions
        anyone_top: dict[int, int] = {}  # the same with priority-0 work only, where what anyone may use grew
        anyone_cpu = anyone_memory = -1
        for i, room in rooms.items():
            most = list(room.compute)
            for recs in room.own.values():
                for rec in recs:
                    for j in rec.gpus:
                        most[j] += rec.milli
            for j, model in enumerate(state.gpu_model[i].tolist()[: int(state.gpu_count[i])]):
                top[model] = max(top.get(model, 0), most[j])
                if i in freed:
                    anyone_top[model] = max(anyone_top.get(model, 0), room.compute[j])
            if i in freed:
                anyone_cpu, anyone_memory = max(anyone_cpu, room.cpu), max(anyone_memory, room.memory)
        found_lines: dict[int, Line] = {}
        for shape in self.index.candidates(top):
            if not shape.guarantee:
                continue
            milli, _, _, cpu_need, mem_need = shape.need
            anyone = (cpu_need <= anyone_cpu and mem_need <= anyone_memory
                      and any(most >= milli for m, most in anyone_top.items()
                              if shape.models is None or m in shape.models)
                      and might_preempt(state, shape.need, shape.models, anyone_rooms))
            for line in shape.guarantee:
                if not line.waiting:
                    continue
                if anyone or (line.priority > lowest.get(line.team, 101) and might_preempt(
                        state, shape.need, shape.models, team_rooms[line.team], line.team, line.priority)):
                    found_lines[id(line)] = line
        for line in self.always:
            if line.waiting and line.group is None and line.head[1].priority > 0:
                found_lines[id(line)] = line
        evicted: list[int] = []
        for line in sorted(found_lines.values(), key=lambda line: self.rank(line, t)):
            evicted += self.evict_for(line, t, why_of, nodes, rooms)
        return evicted

    def evict_for(self, line: Line, t: float, why_of: WhyOf, nodes: list[int],
                  rooms: dict[int, EvictableRoom] | None) -> list[int]:
        """Place the line's requests by preemption on `nodes` while the cycle's rule finds victims;
        the nodes where it evicted. `rooms` (the nodes' evictable room): a quick check first."""
        state = self.state
        evicted: list[int] = []
        while line.waiting and self.arrived(line, t):
            _, req = line.head
            use = self.narrow(line, req)
            if use is None or (rooms is not None and not might_preempt(
                    state, line.need, model_ids(state, use), rooms.values(), req.team, req.priority)):
                break
            found = preempt_on(state, use, nodes)
            if found is None:
                break
            choice, victims = found
            for rid in victims:
                self.release(rid)
                if self.requeue is not None:
                    self.wait_again(rid, t)
            state.reserve(req, choice.node, choice.slots)
            line.waiting.popleft()
            line.quota_limited = False
            why = why_of(choice.node)
            why = why + ", " if why != "when running reservations end" else ""
            self.placed(req, t, f"{why}by preempting {names(list(victims))} (lower priority) on "
                                f"{state.node_names[choice.node]}")
            if rooms is not None:
                rooms[choice.node] = evictable_room(state, choice.node, self.on_node)
            evicted.append(choice.node)
        return evicted

    # ---- the walk -----------------------------------------------------------------------------
    def run(self, lines: list[Line], ends: Mapping[str, float], now: float,
            arrive: Mapping[str, float] | None = None) -> None:
        """Walk the ends (and the expected arrivals `arrive`: id -> when it joins the queue, its
        request in `lines` behind those of the queue) until every request of the queue has started."""
        state = self.state
        self.arrive = arrive or {}
        self.admit(now, lines, lambda node: "")
        live = [line for line in lines if line.waiting]
        # A line that would not fit even once every known end has come (labels aside; with what it
        # may preempt) waits for an unknown end: answered now, and left out of the walk.
        room = room_at_last(state, [*ends, *(rid for rid in self.forecast_ids if rid in self.durations)])
        evictable = Evictable(state) if self.preemption else None
        ever = self.drains.ever if self.drains is not None else None
        blocked = {id(line): line for line in live if not line.always and not fits_in(
            state, room, line.need, line.head[1], evictable.of(line.head[1]) if evictable else None, ever)}
        if blocked:
            self.explain(list(blocked.values()), budget_hit=False, walked=False)
            live = [line for line in live if id(line) not in blocked]
        self.live = live
        self.index = Index([line for line in live if not line.always])
        self.always = [line for line in live if line.always]
        for rid, end in ends.items():
            if rid in state.placed:
                heapq.heappush(self.events, (max(float(end), now), next(self.seq), rid))
        for line in live:
            for _, req in line.waiting:
                if req.id in self.arrive:
                    self.line_of[req.id] = line
                    heapq.heappush(self.events, (max(self.arrive[req.id], now), next(self.seq), req.id))
        for rec in state.placed.values():
            if rec.share.reservation_id not in self.forecast_ids:
                self._hold(rec)
        for b in self.bookings.values():
            heapq.heappush(self.events, (max(b.held_from(), now), next(self.seq), b.id))

        preempting = self.preemption and any(r.priority > 0 for line in live for _, r in line.waiting)
        walked = 0
        budget_hit = False
        waiting = sum(1 for line in live for _, r in line.waiting if r.id not in self.arrive)
        started = self.real_placed
        while self.events and self.real_placed - started < waiting:
            if walked >= self.max_events:
                budget_hit = True
                break
            t = self.events[0][0]
            released: dict[int, list[str]] = {}
            joined: list[Line] = []  # lines whose first request arrived now
            drained: set[int] = set()  # nodes whose planned drain starts or ends now
            self.placed_at, self.freed_guaranteed, self.team_placed = set(), set(), {}
            while self.events and self.events[0][0] == t:
                _, _, rid = heapq.heappop(self.events)
                walked += 1
                if rid in self.line_of:
                    line = self.line_of.pop(rid)
                    if line.waiting and line.head[1].id == rid:
                        joined.append(line)
                elif rid in self.bookings:
                    self.booking_due.append(self.bookings.pop(rid))
                elif rid in self.drain_events:
                    drained.add(self.drain_events.pop(rid))
                elif rid in state.placed and self.end_at.get(rid, t) == t:  # not the end of an evicted run
                    released.setdefault(self.release(rid), []).append(rid)
            reopened = self._redrain(drained, t) if drained else []
            if self.booking_due:
                self.hold_bookings()
            why_of = self._why_of(released, reopened)
            chosen, local, anywhere = self.select([*(i for i in released if state.ready[i] and i not in reopened),
                                                   *reopened], bool(released))
            if joined:  # what just arrived may fit anywhere
                chosen += [line for line in joined if line not in chosen]
                anywhere |= {id(line) for line in joined}
            if chosen:
                self.admit(t, chosen, why_of, local, frozenset(anywhere))
            if preempting:  # after what ended or was placed now, guarantee work may evict lower priorities
                evicted = self.preempt(t, why_of)
                for line in sorted((line for line in joined if line.waiting and line.group is None
                                    and line.head[1].priority > 0), key=lambda line: self.rank(line, t)):
                    nodes = self.victims_near(line.head[1])  # the cycle tries it everywhere
                    if nodes:
                        evicted += self.evict_for(line, t, why_of, nodes, None)
                if evicted:
                    chosen, local, anywhere = self.select(evicted, False)
                    if chosen:
                        self.admit(t, chosen, why_of, local, frozenset(anywhere))
            self.index.forget_empty()
        self.explain(live, budget_hit)
        for rid in (*self.arrive, *(self.requeued - self.kept)):
            self.out.pop(rid, None)

    def _redrain(self, nodes: set[int], t: float) -> list[int]:
        """The readiness of `nodes` at `t` under their planned drains; those that take work again."""
        assert self.drains is not None
        state = self.state
        was = {i: bool(state.ready[i]) for i in nodes}
        self.drains.apply(state, t)
        return sorted(i for i in nodes if state.ready[i] and not was[i])

    def _why_of(self, released: dict[int, list[str]], reopened: Collection[int] = ()) -> WhyOf:
        def why_of(node: int) -> str:
            rids = released.get(node)
            name = self.state.node_names[node]
            if node in reopened and not rids:
                return f"when the planned drain of {name} ends"
            if not rids:
                return "when running reservations end"
            own = [r for r in rids if r in self.forecast_ids]
            if own and len(own) == len(rids):
                return f"when {names(own)}, expected to start before it, finish(es) on {name}"
            return f"when {names(rids)} end(s) on {name}"

        return why_of

    def _ready_for(self, line: Line, walked: bool) -> bool:
        """Whether a node of the line's models takes work at the walk's last time (`walked`), or at
        some time of it."""
        assert self.drains is not None
        ready = self.state.ready if walked else self.drains.ever
        return any(ready[i] and (line.models is None or self.node_models[i] & line.models)
                   for i in range(len(self.node_models)))

    def explain(self, lines: list[Line], budget_hit: bool, walked: bool = True) -> None:
        """Why each request of `lines` left without a start has none (`walked`: after the walk, where
        the nodes are as its last time left them)."""
        blocked_by_own: dict[frozenset[int] | None, bool] = {}
        for line in lines:
            if not line.waiting:
                continue
            req = line.head[1]
            if budget_hit:
                why = (f"no estimate: more than {self.max_events} running reservations end before it could "
                       "start (the forecast looks no further)")
                code = EVENT_BUDGET
            elif line.quota_limited:
                allowed = line.last_allowed or frozenset()
                now_ok = "|".join(sorted(allowed)) if allowed else "no GPU"
                why = (f"no estimate: its team's quota lets it use {now_ok} now, and no known end frees enough "
                       f"quota for a GPU {models_text(req)}")
                code = QUOTA
            elif line.group is not None:
                group = req.group
                assert group is not None
                why = (f"no estimate: pod group {group.name} needs {group.min_members} members placed together, "
                       "and the GPUs that could take them are held by reservations without a known end")
                code = POD_GROUP
            elif self.drains is not None and not self._ready_for(line, walked):
                why = (f"no estimate: the GPUs {models_text(req)} that could take it are on nodes a planned drain "
                       "takes out before it could start, until a person returns them")
                code = NO_READY_GPU
            else:
                if line.models not in blocked_by_own:
                    blocked_by_own[line.models] = any(
                        line.models is None or self.node_models[i] & line.models for i in self.unending)
                tail = (" (or by waiting requests expected to start before it, whose run time is not known)"
                        if blocked_by_own[line.models] else "")
                why = (f"no estimate: the {line.capable_gpus} ready GPU(s) {models_text(req)} that could take it "
                       f"are held by reservations without a known end{tail}")
                code = UNKNOWN_ENDS
            for _, r in line.waiting:
                if r.id not in self.kept:
                    self.out[r.id] = Estimate(None, why, code)
