"""The cycle with booked windows: with no booking the feed has none and the cycle decides as
before; a booking whose lead time has begun gets the borrowed work in its way warned,
saying whose booking and from when, even with nobody waiting."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from portal.placement import bookings_feed, snapshot
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy import policy
from scheduler.core import Booking
from tests.portal.placement.test_fair_share import ADMIN, T4, get_reservation, post_reservation, quota_row, set_quotas


def test_without_bookings_the_snapshot_has_none(db, fleet):
    now = timezone.now()
    assert bookings_feed.bookings(now) == ()
    built = snapshot.build()
    assert built.bookings == () and built.durations == {}


def test_the_lead_is_the_teams_grace_and_never_under_15_minutes():
    assert bookings_feed.lead_of(None) == 900.0
    assert bookings_feed.lead_of(300) == 900.0
    assert bookings_feed.lead_of(3600) == 3600.0


def test_a_window_ends_at_its_end_field_or_after_its_duration():
    start = timezone.now()
    assert bookings_feed._window_end(start, start + timedelta(hours=2), 60) == start + timedelta(hours=2)
    assert bookings_feed._window_end(start, None, 3600) == start + timedelta(hours=1)
    assert bookings_feed._window_end(start, None, None) is None


def test_borrowed_work_in_a_booked_windows_way_is_warned_ahead(
        client_for, reservation_body, teams, placement_loop, monkeypatch):
    """nlp borrows both T4s; vision booked one T4 from in 10 minutes (its lead, 15 minutes, has
    begun). With nobody waiting, the cycle warns one of nlp's reservations, due at the window's
    start, saying whose booking it is."""
    set_quotas(teams["vision"], quota_row("T4", 2))
    set_quotas(teams["nlp"], quota_row("T4", 0))
    policy.set_policy(teams["nlp"], ADMIN, {"reclaim_grace_s": 60})
    bob = client_for("bob")
    borrowed = [post_reservation(bob, reservation_body(team="nlp", **T4))["id"] for _ in range(2)]
    placement_loop()
    assert [get_reservation(bob, b)["admission"] for b in borrowed] == ["borrowed", "borrowed"]
    starts = timezone.now() + timedelta(minutes=10)
    window = Booking("999999", "vision", "T4", 1.0, 15_000, 1, starts.timestamp(),
                     (starts + timedelta(hours=2)).timestamp(), 900.0)
    monkeypatch.setattr(bookings_feed, "bookings", lambda now: (window,))  # the booked row comes with the migration
    placement_loop(sync=False)
    warned = Reservation.objects.filter(pk__in=borrowed, reclaim_at__isnull=False)
    assert warned.count() == 1
    victim = warned.get()
    assert victim.state == State.RUNNING
    assert abs((victim.reclaim_at - starts).total_seconds()) < 1
    assert f"capacity booked by team vision from {starts:%H:%M} UTC" in victim.state_reason
