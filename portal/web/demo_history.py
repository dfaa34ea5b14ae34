"""A week of plausible past usage for the demo, so every report and chart has something to show.

Each past reservation is made the way the live system makes one, through the reservation services
(submitted, placed after a short wait, running, then finished or cancelled), with Django's clock
moved to the moment each step happened; what it used is written as the telemetry minute rollups
the agents' samples would have become (more during working hours, some shares idle, some bursting
above their request), then folded into the hourly rows the reports read. Deterministic (a fixed
seed) and idempotent: the reservations are named "hist-…", and a database that has them gets
nothing more.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from unittest import mock

from django.db import transaction
from django.utils import timezone

from portal.fleet.models import Gpu
from portal.reservations import actors, rules, services
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.telemetry import hours
from portal.telemetry.models import GpuMinute, RollupState, ShareMinute
from portal.tenancy import roles
from portal.tenancy.models import Membership

PREFIX = "hist-"
DAYS = 7
GPUS = 6  # the GPUs the history runs on: a few of each model, not the whole fleet (startup time)
SHARES = [Decimal("0.25"), Decimal("0.5"), Decimal("0.5"), Decimal("1.0")]


@contextmanager
def clock_at(when: datetime) -> Iterator[None]:
    """Django's clock (`django.utils.timezone.now`, which the services and auto_now fields read)
    stands at `when` inside the block: the history is written as if it happened then."""
    with mock.patch("django.utils.timezone.now", return_value=when):
        yield


def seeded() -> bool:
    return Reservation.objects.filter(name__startswith=PREFIX).exists()


def seed_week(now: datetime | None = None, seed: int = 7) -> int:
    """Add the week before `now`; returns how many reservations were made (0: already there)."""
    if seeded():
        return 0
    now = now or timezone.now()
    rng = random.Random(seed)
    people = [(m.user, m.team) for m in Membership.objects.select_related("user", "team").order_by("user__username",
                                                                                                    "team__slug")
              if m.role in roles.SUBMIT_ROLES]
    gpus = _some_gpus()
    if not people or not gpus:
        return 0
    start = hours.floor_hour(now) - timedelta(days=DAYS)
    end = hours.floor_hour(now) - timedelta(hours=1)
    made = 0
    share_rows: list[ShareMinute] = []
    busy: dict[tuple[int, datetime], float] = {}
    # One transaction: the placement cycle and the live pushes that the services ask for run after
    # it commits, when every past reservation has ended, so they see nothing of it half made.
    with transaction.atomic():
        for gpu in gpus:
            for begin, finish, share in _lanes(rng, start, end):
                user, team = rng.choice(people)
                r = _one(rng, user, team, gpu, begin, finish, share, made)
                if r is None:
                    continue
                made += 1
                _usage(rng, r, gpu, begin, finish, share, share_rows, busy)
        ShareMinute.objects.bulk_create(share_rows, batch_size=5000, ignore_conflicts=True)
        GpuMinute.objects.bulk_create([
            GpuMinute(gpu_id=gpu_id, minute=minute, samples=60, sm_util_sum=round(60 * pct), sm_util_count=60,
                      sm_util_max=min(100, round(pct * 1.2)), mem_used_sum=0, mem_used_max=0, power_sum=0.0,
                      power_count=0)
            for (gpu_id, minute), pct in busy.items()], batch_size=5000, ignore_conflicts=True)
        # Fold into hours what the live roll-up already passed (it folds the rest when it gets there).
        state = RollupState.objects.first()
        if state is not None and state.hours_rolled_up_to is not None:
            hours.fold(start, min(end, state.hours_rolled_up_to), folded_to=state.hours_rolled_up_to)
    return made


def _some_gpus() -> list[Gpu]:
    """Up to GPUS GPUs, spread over the models (index 0, 1, … of each model in turn)."""
    by_model: dict[str, list[Gpu]] = {}
    for gpu in Gpu.objects.select_related("node").filter(healthy=True, cordoned=False).order_by("node__name", "index"):
        by_model.setdefault(gpu.model, []).append(gpu)
    picked: list[Gpu] = []
    while len(picked) < GPUS and any(by_model.values()):
        for model in sorted(by_model):
            if by_model[model] and len(picked) < GPUS:
                picked.append(by_model[model].pop(0))
    return picked


def _lanes(rng: random.Random, start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime, Decimal]]:
    """Two lanes of reservations per GPU, one after another in each lane, their shares adding to
    at most one GPU: lane one any share, lane two half a GPU at most beside a half."""
    for lane in (0, 1):
        t = start + timedelta(minutes=rng.randrange(0, 12 * 60))
        while True:
            share = rng.choice(SHARES if lane == 0 else SHARES[:2])
            if lane == 0 and share > Decimal("0.5"):
                share = Decimal("0.5") if rng.random() < 0.5 else share
            length = timedelta(minutes=rng.randrange(45, 9 * 60))
            if t + length > end:
                return
            yield t, t + length, share
            t += length + timedelta(minutes=rng.randrange(20, 14 * 60))


def _one(rng, user, team, gpu, begin: datetime, finish: datetime, share: Decimal, n: int) -> Reservation | None:
    """One past reservation through the services: submitted a few minutes before `begin`,
    placed and running from `begin`, ended at `finish`. None when this GPU cannot take it now."""
    limit = min(Decimal("1"), share * 2)
    spec = rules.ReservationSpec(team=team, image="pytorch/pytorch:2.3.0", name=f"{PREFIX}{n}",
                                 kind=rng.choice(["batch", "batch", "interactive"]), gpu_request=share,
                                 gpu_limit=limit, gpu_memory_mib=min(gpu.memory_mib // 4, 16384), gpu_model=gpu.model)
    try:
        with transaction.atomic():  # a savepoint: a reservation left out leaves nothing behind
            with clock_at(begin - timedelta(minutes=rng.randrange(1, 40))):
                r = services.submit(user, spec)
            with clock_at(begin):
                services.place(r.pk, gpu.node_id, [services.NewAllocation(gpu.pk, share, spec.gpu_memory_mib)],
                               actor=actors.DEMO_HISTORY)
            with clock_at(begin + timedelta(seconds=20)):
                services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", actors.DEMO_HISTORY)
            outcome = State.SUCCEEDED if rng.random() < 0.8 else State.FAILED
            with clock_at(finish):
                if rng.random() < 0.1:
                    services.cancel(r.pk, user)
                else:
                    services.release(r.pk, outcome, "its pod ended", actors.DEMO_HISTORY)
    except (rules.RuleViolation, services.CapacityConflict):
        # A GPU held now by a live reservation, or a rule of the team: this one is left out.
        return None
    return r


def _usage(rng, r: Reservation, gpu: Gpu, begin: datetime, finish: datetime, share: Decimal,
           rows: list[ShareMinute], busy: dict) -> None:
    """The minute rollups of what `r` used: a working-day curve, idle for some, bursting for others."""
    idle = rng.random() < 0.2
    burst = not idle and rng.random() < 0.3
    limit = float(min(Decimal("1"), share * 2)) if burst else float(share)
    minute = begin.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while minute < finish:
        local_hour = (minute.hour + minute.minute / 60) % 24
        day_curve = 0.55 + 0.4 * math.sin(math.pi * (local_hour - 7) / 12) if 7 <= local_hour <= 19 else 0.35
        level = 0.03 if idle else max(0.0, min(1.0, day_curve + rng.uniform(-0.15, 0.15)))
        used = round(min(limit, float(share) * level * (1.6 if burst else 1.0)), 4)
        rows.append(ShareMinute(reservation_id=r.pk, gpu_id=gpu.pk, team_id=r.team_id, minute=minute, samples=60,
                                used_sum=used * 60, used_max=min(1.0, used * 1.1)))
        key = (gpu.pk, minute)
        busy[key] = min(100.0, busy.get(key, 0.0) + used * 100)
        minute += timedelta(minutes=1)
