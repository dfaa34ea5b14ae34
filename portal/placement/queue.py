"""Where each waiting reservation stands: its place in the queue (the cycle's fair-share order) and
its estimated start (`scheduler.core.forecast`: the queue run forward over the known ends of what
runs, on the GPUs that could take each request, with quota as its gate), or why there is none.

A known end is a reservation's expiry, which many release earlier: each becomes its likely end,
and each waiting request's maximum duration its likely run time, from how much of their reserved
time recently ended reservations used (`RunLengths`: per owner, team and GPU count where enough
ended, else all of them; the last LEARN_FROM within LEARN_WITHIN_S, read again every LEARNT_FOR_S).

Work that arrives later competes too (a team further below its share, a higher priority, goes
ahead; small work takes room first): the forecast walks the demand expected over the next hours
(`Arrivals`: per team, model and priority band, the rate, sizes and run lengths of the
reservations submitted within the last day; at most ARRIVALS_FROM, read again every LEARNT_FOR_S)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from portal.precompiled import Precompiled, param_in
from portal.reservations import services
from portal.reservations.models import Kind, Reservation
from portal.reservations.states import HOLDS_GPU, State
from scheduler import core
from scheduler.core.fairqueue import FairHooks
from scheduler.core.forecast import Arrivals, Estimate, RunLengths, estimate_starts
from scheduler.core.forecast.arrivals import DEFAULT_HORIZON_S as HORIZON_S
from scheduler.core.queue import queue_order

from . import snapshot
from .reasons import estimate_words
from .snapshot import Pending

ESTIMATED = 1000  # the first this many in the queue get an estimate; the rest are told how many are ahead
LEARN_FROM = 5000  # run lengths are learnt from this many reservations that ended last
LEARN_WITHIN_S = 30 * 86400  # that ended within this long
LEARNT_FOR_S = 300.0  # and read again after this long (they change slowly; a cycle runs every few seconds)
# Ended by their owner or their expiry: what a running reservation's own end will be like (not a
# preemption, a failure or a lost node).
ENDED = (State.SUCCEEDED, State.CANCELLED, State.EXPIRED)
ARRIVALS_FROM = 5000  # the expected arrivals are learnt from at most this many reservations submitted last


class Queued(NamedTuple):
    """What a cycle reads of the whole queue (briefly: it may hold thousands)."""

    pk: int
    priority: int
    created_at: datetime
    position: int | None
    estimated_start: datetime | None
    group: str


# Every cycle runs these: compiled once (portal.precompiled).
_QUEUE = Precompiled(lambda: Reservation.objects.filter(state=State.PENDING).order_by("created_at", "id")
                     .values_list("pk", "priority", "created_at", "queue_position", "estimated_start", "group_name"))
_KNOWN_ENDS = Precompiled(lambda: Reservation.objects.filter(state__in=HOLDS_GPU, expires_at__isnull=False)
                          .order_by().values_list("pk", "expires_at", "placed_at", "owner_id", "team_id", "gpu_count"))
_DURATIONS = Precompiled(lambda: Reservation.objects.filter(param_in("pk", "ids")).order_by()
                         .values_list("pk", "max_duration_s", "kind", "team__interactive_max_s", "state_reason",
                                      "owner_id", "team_id", "gpu_count"))

class _Learnt:
    """What the forecast learns from the database (`learn()`), kept per process for LEARNT_FOR_S
    seconds: it changes slowly, and a cycle runs every few seconds."""

    def __init__(self, learn: Callable[[], Any]) -> None:
        self._learn = learn
        self._lock = threading.Lock()
        self._kept: tuple[float, Any] | None = None  # (monotonic time learnt, what)

    def __call__(self) -> Any:
        with self._lock:
            if self._kept is not None and time.monotonic() - self._kept[0] < LEARNT_FOR_S:
                return self._kept[1]
        learnt = self._learn()
        with self._lock:
            self._kept = (time.monotonic(), learnt)
        return learnt

    def forget(self) -> None:
        with self._lock:
            self._kept = None


def _keys(owner_id: int, team_id: int, gpu_count: int) -> tuple:
    """What a reservation's run length is learnt under, most specific first."""
    return ("owner", owner_id), ("team", team_id), ("gpus", gpu_count)


def _learn_run_lengths() -> RunLengths:
    """How much of their reserved time the last LEARN_FROM reservations that ended used."""
    lengths = RunLengths()
    ended = (Reservation.objects.filter(state__in=ENDED, placed_at__isnull=False, expires_at__isnull=False,
                                        finished_at__gte=timezone.now() - timedelta(seconds=LEARN_WITHIN_S))
             .order_by("-finished_at")
             .values_list("placed_at", "expires_at", "finished_at", "owner_id", "team_id", "gpu_count")[:LEARN_FROM])
    for placed_at, expires_at, finished_at, owner, team, gpus in ended:
        lengths.observe((finished_at - placed_at).total_seconds(), (expires_at - placed_at).total_seconds(),
                        _keys(owner, team, gpus))
    return lengths


def _learn_arrivals() -> Arrivals:
    """The reservations submitted within the last day (the last ARRIVALS_FROM; the window shrinks to
    what they span when there are more), each with how long it ran where it ended: what the forecast
    expects to arrive next."""
    now = timezone.now()
    window = Arrivals().window_s
    # What waited or ran: not what was cancelled or refused before it was ever placed.
    rows = list(Reservation.objects.filter(Q(state=State.PENDING) | Q(placed_at__isnull=False),
                                           created_at__gte=now - timedelta(seconds=window))
                .order_by("-created_at").values_list("pk", "team__slug", *Pending._fields[2:], "state", "placed_at",
                                                     "finished_at")[:ARRIVALS_FROM])
    if len(rows) == ARRIVALS_FROM:
        window = (now - rows[-1][Pending._fields.index("created_at")]).total_seconds()
    learnt = Arrivals(window_s=max(window, 1.0))
    for row in rows:
        r, (state, placed_at, finished_at) = Pending._make(row[:len(Pending._fields)]), row[len(Pending._fields):]
        try:
            req = snapshot.to_request(r)
        except ValueError:
            continue
        ran = (finished_at - placed_at).total_seconds() if state in ENDED and finished_at and placed_at else None
        learnt.observe(req.created_at, req, ran)
    return learnt


run_lengths = _Learnt(_learn_run_lengths)
arrivals = _Learnt(_learn_arrivals)


def forget_learnt() -> None:
    """Learn again at the next forecast (after reservations were rewritten, e.g. in tests): run
    lengths and expected arrivals."""
    run_lengths.forget()
    arrivals.forget()


def read_queue() -> list[Queued]:
    return [Queued._make(row) for row in _QUEUE.all()]


def _forecast(fleet: core.Snapshot, requests: list[core.Request]) -> tuple[list[core.Request], dict[str, Estimate],
                                                                          dict[int, str]]:
    """The cycle's order of `requests` and the forecast's estimate of each (the first ESTIMATED),
    and the reasons the waiting rows have now (pk → state_reason)."""
    now = fleet.now
    if fleet.quotas is not None:
        hooks = FairHooks(fleet, requests)
        ordered = sorted(requests, key=lambda r: hooks.key(r, now))
    else:
        hooks = None
        ordered = queue_order(requests, fleet.teams, now)
    lengths = run_lengths()
    ends = {}
    for pk, expires_at, placed_at, owner, team, gpus in _KNOWN_ENDS.all():
        if placed_at is None:
            ends[str(pk)] = expires_at.timestamp()
        else:
            ends[str(pk)] = lengths.end(placed_at.timestamp(), (expires_at - placed_at).total_seconds(), now,
                                        _keys(owner, team, gpus))
    durations, reasons = {}, {}
    ids = [int(r.id) for r in ordered[:ESTIMATED] if r.id.isdigit()]
    for pk, seconds, kind, interactive_max_s, reason, owner, team, gpus in _DURATIONS.all(ids=ids):
        if seconds is None and kind == Kind.INTERACTIVE:
            seconds = interactive_max_s or None
        if seconds:
            durations[str(pk)] = lengths.run(float(seconds), _keys(owner, team, gpus))
        reasons[pk] = reason
    expected = arrivals().forward(now, HORIZON_S) if settings.TESSERA_FORECAST_ARRIVALS else ()
    drains = snapshot.planned_drains(datetime.fromtimestamp(now, tz=UTC))
    estimates = estimate_starts(fleet, ordered, ends, now=now, durations=durations, gate=hooks, order=hooks,
                                limit=ESTIMATED, arrivals=expected, arrivals_until=now + HORIZON_S, withhold=False,
                                drains=drains)
    return ordered, estimates, reasons


def _when(e: Estimate | None) -> datetime | None:
    if e is None or e.start is None:
        return None
    return max(datetime.fromtimestamp(e.start, tz=UTC), timezone.now())


def _why_none(e: Estimate | None) -> str:
    """Why there is no estimated start ("" when there is one), without the forecast's own lead-in."""
    if e is None or e.start is not None:
        return ""
    return estimate_words(e.reason.removeprefix("no estimate: ").removeprefix("no estimate"))


def waiting_requests(fleet: core.Snapshot) -> list[core.Request]:
    requests = []
    for r in snapshot.pending([q.pk for q in read_queue()]):
        try:
            requests.append(snapshot.to_request(r))
        except ValueError:
            continue  # the cycle says why it cannot be placed as asked
    return requests


def update_queue(queue: list[Queued], fleet: core.Snapshot | None = None) -> None:
    """Queue position and estimated start of what still waits after the cycle: the order is the
    cycle's (fair share), the estimate the forecast's; where there is none, its reason goes into
    the reservation's reason ("…; no estimate: …"). `fleet`: the cluster after the cycle (the
    cycle's snapshot with what it committed, `forecast.after_cycle`); None: read it now."""
    if not queue:
        services.set_queue_positions([])
        return
    if fleet is None:
        fleet = snapshot.build()
    ordered, estimates, reasons = _forecast(fleet, waiting_requests(fleet))
    known = {q.pk: q for q in queue}
    changed, notes = [], []
    for position, req in enumerate(ordered, start=1):
        pk = int(req.id)
        e = estimates.get(req.id)
        start = _when(e)
        q = known.get(pk)
        if q is None or q.position != position or q.estimated_start != start:
            changed.append((pk, position, start))
        if pk in reasons:
            notes.append((pk, reasons[pk], _why_none(e)))
    services.set_queue_positions(changed)
    services.note_estimate_reasons(notes)


def estimate_for(fleet: core.Snapshot, request: core.Request) -> tuple[int, datetime | None, str]:
    """Where `request` would stand if it were submitted now, when it may start, and why there is no
    estimate when there is none (the request page's preview): the same order and forecast."""
    ordered, estimates, _ = _forecast(fleet, [*waiting_requests(fleet), request])
    position = next(i for i, r in enumerate(ordered, start=1) if r.id == request.id)
    e = estimates.get(request.id)
    return position, _when(e), _why_none(e)
