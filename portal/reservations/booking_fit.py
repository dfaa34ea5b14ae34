"""Whether a booking fits its GPU model's cards and its team's quota over its window, and the
nearest windows of the same length that do. Plain data in and out, no Django, no I/O: the booking
service reads the cards and the bookings once and asks here as often as it needs.

Capacity is judged at every instant a booked window starts inside the asked window (the most that
is booked at once is reached at one of them): the bookings active then and the new one must pack
onto the model's cards (whole-GPU bookings of several cards on one node, fractions by compute and
memory, first fit from the largest), which is a sufficient test, never an optimistic one.
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


def _instants(start: datetime, end: datetime, overlapping: Sequence[Booked]) -> list[datetime]:
    return sorted({start} | {b.starts_at for b in overlapping if start < b.starts_at < end})


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


def capacity_conflict(model: str, cards: Sequence[Card], booked: Sequence[Booked], new: Booked) -> Taken | None:
    """None when `new` fits the model's cards beside every booking overlapping its window."""
    overlapping = [b for b in booked if b.id != new.id and b.overlaps(new.starts_at, new.ends_at)]
    total_memory = sum(c.memory_mib for c in cards)
    for at in _instants(new.starts_at, new.ends_at, overlapping):
        active = [b for b in overlapping if b.starts_at <= at < b.ends_at]
        if _pack(cards, [*active, new]):
            continue
        milli = sum(b.milli * b.gpus for b in active)
        memory = sum(b.memory_mib * b.gpus for b in active)
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


def conflict(model: str, cards: Sequence[Card], quota: TeamQuota, booked: Sequence[Booked], new: Booked
             ) -> Taken | None:
    """The team's quota first (the team can act on it), then the model's capacity."""
    return quota_conflict(model, quota, booked, new) or capacity_conflict(model, cards, booked, new)


def free_windows(model: str, cards: Sequence[Card], quota: TeamQuota, booked: Sequence[Booked], new: Booked, *,
                 earliest: datetime, latest: datetime, step: timedelta, count: int = 3
                 ) -> list[tuple[datetime, datetime]]:
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
                if conflict(model, cards, quota, relevant, moved) is None:
                    found.append((start, start + length))
        k += 1
    return found
