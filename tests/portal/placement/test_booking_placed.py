"""A booking at its start is placed by the next cycle like any request, and ends with its window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from portal.placement import bookings
from portal.reservations import rules, services
from portal.reservations.models import Reservation
from portal.reservations.states import State
from tests.reservations import clock_at


def test_a_started_booking_is_placed_by_the_next_cycle_until_its_window_ends(people, teams, cluster,
                                                                             placement_loop):
    day = datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0) + timedelta(days=2)
    spec = rules.ReservationSpec(team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.5"),
                                 gpu_memory_mib=4096, gpu_model="T4")
    [r] = services.book(people["alice"], spec, services.window_of(day, day + timedelta(hours=2)))
    placement_loop()
    r.refresh_from_db()
    assert r.state == State.BOOKED  # the cycle leaves a booking alone until its start
    with clock_at(day + timedelta(seconds=4)):
        bookings.tick()
        placement_loop()
    r = Reservation.objects.get(pk=r.pk)
    assert r.state in (State.PLACED, State.RUNNING) and r.gpu_model == "T4"
    assert r.placed_at - day < timedelta(seconds=60)
    assert r.expires_at == day + timedelta(hours=2)


def test_the_engine_feed_sees_a_booking_with_its_window(people, teams, fleet):
    from portal.placement import bookings_feed

    start = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    spec = rules.ReservationSpec(team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.5"),
                                 gpu_memory_mib=4096, gpu_model="T4")
    [r] = services.book(people["alice"], spec, services.window_of(start, start + timedelta(hours=3)))
    [seen] = bookings_feed.bookings(datetime.now(UTC))
    assert (seen.team, seen.gpu_model, seen.starts_at, seen.ends_at) == (
        "vision", "T4", start.timestamp(), (start + timedelta(hours=3)).timestamp())
    services.move_booking(r.pk, people["alice"], start + timedelta(hours=1), start + timedelta(hours=2))
    [seen] = bookings_feed.bookings(datetime.now(UTC))
    assert (seen.starts_at, seen.ends_at) == ((start + timedelta(hours=1)).timestamp(),
                                              (start + timedelta(hours=2)).timestamp())
