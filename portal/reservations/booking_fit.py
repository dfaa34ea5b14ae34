"""Whether a booking fits its GPU model's cards and its team's quota over its window, and the
nearest windows of the same length that do. Plain data in and out, no Django, no I/O: the booking
service reads the cards and the bookings once and asks here as often as it needs.

Capacity is judged at every instant a booked window or a planned drain starts inside the asked
window (the most that is booked at once, on the fewest cards, is reached at one of them): the
bookings active then and the new one must pack onto the model's cards not drained then (whole-GPU
bookings of several cards on one node, fractions by compute and memory, first fit from the
largest), which is a sufficient test, never an optimistic one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

WHOLE = 1000  # milli of one GPU


@dataclass(frozen=True)
class Card:
    """One GPU of the model that bookings may count on."""

    node: str
    memory_mib: int


@dataclass(frozen=True)
class Booked:
    """A booking's window and terms (milli per GPU, memory per GPU, GPUs)."""

    id: int
    team: str
    starts_at: datetime
    ends_at: datetime
    milli: int
    memory_mib: int
    gpus: int

    def overlaps(self, start: datetime, end: datetime) -> bool:
        return self.starts_at < end and self.ends_at > start


@dataclass(frozen=True)
class Outage:
    """A node's cards out of the count over a window (a planned drain; no end: until further notice)."""

    node: str
    starts_at: datetime
    ends_at: datetime | None
    text: str  # what a refused booking is told: "node a100-1 is drained for maintenance …"

    def covers(self, at: datetime) -> bool:
        return self.starts_at <= at and (self.ends_at is None or at < self.ends_at)


@dataclass(frozen=True)
class TeamQuota:
    """The team's quota for the model's bucket: compute milli, memory MiB, GPUs (0 without a row)."""

    milli: int
    memory_mib: int
    gpus: int


@dataclass(frozen=True)
class Taken:
    """Why a window does not fit: when, and what is booked then."""

    at: datetime
    message: str


def _pack(cards: Sequence[Card], active: Iterable[Booked]) -> bool:
    """Whether every booking in `active` fits on `cards` at once."""
    nodes: dict[str, list[list[int]]] = defaultdict(list)
    for card in cards:
        nodes[card.node].append([WHOLE, card.memory_mib, card.memory_mib])  # free milli, free memory, whole
    bookings = sorted(active, key=lambda b: (-b.gpus, -b.milli, -b.memory_mib))
    for b in bookings:
        if b.gpus > 1:
            # whole cards on one node: the node with the fewest free cards that has enough
            choices = [(sum(1 for c in free if c[0] == WHOLE and c[1] == c[2]), name) for name, free in nodes.items()]
            fitting = sorted((n, name) for n, name in choices if n >= b.gpus)
            if not fitting:
                return False
            taken = 0
            for c in nodes[fitting[0][1]]:
                if taken < b.gpus and c[0] == WHOLE and c[1] == c[2] and c[1] >= b.memory_mib:
                    c[0], c[1] = 0, c[1] - b.memory_mib
                    taken += 1
            if taken < b.gpus:
                return False
            continue
        best = None
        for free in nodes.values():
            for c in free:
                if c[0] >= b.milli and c[1] >= b.memory_mib and (best is None or c[0] < best[0]):
                    best = c
        if best is None:
            return False
        best[0] -= b.milli
        best[1] -= b.memory_mib
    return True


def _instants(start: datetime, end: datetime, overlapping: Sequence[Booked], outages: Sequence[Outage] = ()
              ) -> list[datetime]:
    return sorted({start} | {b.starts_at for b in overlapping if start < b.starts_at < end}
                  | {o.starts_at for o in outages if start < o.starts_at < end})


def _up(cards: Sequence[Card], outages: Sequence[Outage], at: datetime) -> list[Card]:
    """The cards not drained at `at`."""
    down = {o.node for o in outages if o.covers(at)}
    return [c for c in cards if c.node not in down] if down else list(cards)


def _gpus(milli: int) -> str:
    return f"{milli / WHOLE:g}"


def at_text(at: datetime) -> str:
    """Like '2026-12-01 09:00 UTC'."""
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def window_text(start: datetime, end: datetime) -> str:
    """'2026-12-01 09:00–11:00 UTC' (the end's date when it is another day)."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    end_text = f"{end:%H:%M}" if start.date() == end.date() else f"{end:%Y-%m-%d %H:%M}"
    return f"{start:%Y-%m-%d %H:%M}–{end_text} UTC"


def capacity_conflict(model: str, cards: Sequence[Card], booked: Sequence[Booked], new: Booked,
                      outages: Sequence[Outage] = ()) -> Taken | None:
    """None when `new` fits the model's cards beside every booking overlapping its window, on the
    cards not drained at each instant."""
    overlapping = [b for b in booked if b.id != new.id and b.overlaps(new.starts_at, new.ends_at)]
    outages = [o for o in outages if any(c.node == o.node for c in cards)]
    total_memory = sum(c.memory_mib for c in cards)
    for at in _instants(new.starts_at, new.ends_at, overlapping, outages):
        active = [b for b in overlapping if b.starts_at <= at < b.ends_at]
        up = _up(cards, outages, at)
        if _pack(up, [*active, new]):
            continue
        milli = sum(b.milli * b.gpus for b in active)
        memory = sum(b.memory_mib * b.gpus for b in active)
        if len(up) < len(cards) and _pack(cards, [*active, new]):
            drains = "; ".join(o.text for o in outages if o.covers(at))
            return Taken(at, (
                f"{model} has too little left for {window_text(new.starts_at, new.ends_at)}: {drains}, leaving "
                f"{len(up)} of its {len(cards)} GPUs from {at_text(at)}, where {_gpus(milli)} GPUs' compute "
                f"and {memory // 1024} GiB are booked; too little for {_gpus(new.milli * new.gpus)} GPU"
                f"{'s' if new.milli * new.gpus != WHOLE else ''} with {new.memory_mib * new.gpus // 1024} GiB"))
        return Taken(at, (
            f"{model} is fully booked for {window_text(new.starts_at, new.ends_at)}: from {at_text(at)} "
            f"{_gpus(milli)} of its {len(cards)} GPUs' compute and {memory // 1024} of {total_memory // 1024} GiB "
            f"are booked, too little is left for {_gpus(new.milli * new.gpus)} GPU"
            f"{'s' if new.milli * new.gpus != WHOLE else ''} with {new.memory_mib * new.gpus // 1024} GiB"))
    return None


def quota_conflict(model: str, quota: TeamQuota, booked: Sequence[Booked], new: Booked) -> Taken | None:
    """None when the team's bookings overlapping `new`'s window, with it, stay within its quota for
    the model at every instant."""
    own = [b for b in booked if b.id != new.id and b.team == new.team and b.overlaps(new.starts_at, new.ends_at)]
    for at in _instants(new.starts_at, new.ends_at, own):
        active = [b for b in own if b.starts_at <= at < b.ends_at] + [new]
        milli = sum(b.milli * b.gpus for b in active)
        memory = sum(b.memory_mib * b.gpus for b in active)
        gpus = sum(b.gpus for b in active)
        if milli <= quota.milli and memory <= quota.memory_mib and gpus <= quota.gpus:
            continue
        taken = active[:-1]
        return Taken(at, (
            f"team {new.team}'s {model} quota ({_gpus(quota.milli)} GPU share, {quota.memory_mib // 1024} GiB, "
            f"{quota.gpus} GPUs) does not cover this booking for {window_text(new.starts_at, new.ends_at)}: from "
            f"{at_text(at)} its bookings take {_gpus(sum(b.milli * b.gpus for b in taken))} GPU share, "
            f"{sum(b.memory_mib * b.gpus for b in taken) // 1024} GiB and {sum(b.gpus for b in taken)} GPUs"))
    return None


def conflict(model: str, cards: Sequence[Card], quota: TeamQuota, booked: Sequence[Booked], new: Booked,
             outages: Sequence[Outage] = ()) -> Taken | None:
    """The team's quota first (the team can act on it), then the model's capacity."""
    return quota_conflict(model, quota, booked, new) or capacity_conflict(model, cards, booked, new, outages)


def broken_by(cards: Sequence[Card], booked: Sequence[Booked], outages: Sequence[Outage], new: Outage,
              end: datetime) -> list[Booked]:
    """The bookings that fit their model's cards beside `outages` but would not once `new` (a
    planned drain, up to `end` when it has none) is added. The bookings made first keep their
    place: at each instant those active are packed in booking order, and one that no longer fits
    is broken (from then on it counts nowhere)."""
    window_end = new.ends_at or end
    relevant = sorted((b for b in booked if b.overlaps(new.starts_at, window_end)), key=lambda b: b.id)
    before = _broken(cards, relevant, outages, new.starts_at, window_end)
    after = _broken(cards, relevant, [*outages, new], new.starts_at, window_end)
    return sorted((b for i, b in after.items() if i not in before), key=lambda b: (b.starts_at, b.id))


def _broken(cards: Sequence[Card], relevant: Sequence[Booked], outages: Sequence[Outage], start: datetime,
            end: datetime) -> dict[int, Booked]:
    broken: dict[int, Booked] = {}
    for at in _instants(start, end, relevant, outages):
        up = _up(cards, outages, at)
        kept: list[Booked] = []
        for b in relevant:
            if b.id in broken or not b.starts_at <= at < b.ends_at:
                continue
            if _pack(up, [*kept, b]):
                kept.append(b)
            else:
                broken[b.id] = b
    return broken


def free_windows(model: str, cards: Sequence[Card], quota: TeamQuota, booked: Sequence[Booked], new: Booked, *,
                 earliest: datetime, latest: datetime, step: timedelta, count: int = 3,
                 outages: Sequence[Outage] = ()) -> list[tuple[datetime, datetime]]:
    """Up to `count` windows of `new`'s length nearest to it (moved by whole `step`s, later and
    earlier in turn), starting no earlier than `earliest` and ending no later than `latest`, where
    it would fit; nearest first."""
    length = new.ends_at - new.starts_at
    relevant = [b for b in booked if b.id != new.id and b.overlaps(earliest, latest)]
    found: list[tuple[datetime, datetime]] = []
    k = 1
    while len(found) < count:
        later, earlier = new.starts_at + k * step, new.starts_at - k * step
        if later + length > latest and earlier < earliest:
            break
        for start in (later, earlier):
            if len(found) < count and earliest <= start and start + length <= latest:
                moved = Booked(new.id, new.team, start, start + length, new.milli, new.memory_mib, new.gpus)
                if conflict(model, cards, quota, relevant, moved, outages) is None:
                    found.append((start, start + length))
        k += 1
    return found
