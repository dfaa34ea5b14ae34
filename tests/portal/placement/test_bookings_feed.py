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
from tests.portal.placement.test_fair_share import (
    ADMIN,
    NO_LENDING,
    T4,
    get_reservation,
    post_reservation,
    quota_row,
    set_quotas,
)


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
    assert bookings_feed.window_end(start, start + timedelta(hours=2), 60) == start + timedelta(hours=2)
    assert bookings_feed.window_end(start, None, 3600) == start + timedelta(hours=1)
    assert bookings_feed.window_end(start, None, None) is None


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


def test_opportunistic_work_in_a_booked_windows_way_is_warned_with_its_teams_grace(
        client_for, browser_for, reservation_body, teams, placement_loop, cluster, monkeypatch):
    """nlp has no T4 quota and may not borrow, but may run over its quota: its priority-0 work runs
    opportunistically on both T4s. vision booked one T4 from in 10 minutes: one of nlp's
    reservations is warned as borrowed work would be (its page, nlp's notification, its pod's
    SIGTERM with the time left), due at the window's start."""
    from portal.notifications.models import Event, Notification
    from portal.placement import pods

    set_quotas(teams["vision"], quota_row("T4", 2))
    set_quotas(teams["nlp"], quota_row("T4", 0, borrow=NO_LENDING))
    policy.set_policy(teams["nlp"], ADMIN, {"reclaim_grace_s": 60, "allow_over_quota": True})
    bob = client_for("bob")
    idle = [post_reservation(bob, reservation_body(team="nlp", priority=0, **T4))["id"] for _ in range(2)]
    placement_loop()
    assert [get_reservation(bob, r)["admission"] for r in idle] == ["opportunistic", "opportunistic"]
    graces: dict[str, int] = {}
    real_delete = pods.delete_quietly

    def delete_quietly(backend, namespace, name, why, *grace):
        graces[name] = grace[0] if grace else pods.GRACE_S
        return real_delete(backend, namespace, name, why, *grace)

    monkeypatch.setattr(pods, "delete_quietly", delete_quietly)
    starts = timezone.now() + timedelta(minutes=10)
    window = Booking("999999", "vision", "T4", 1.0, 15_000, 1, starts.timestamp(),
                     (starts + timedelta(hours=2)).timestamp(), 900.0)
    monkeypatch.setattr(bookings_feed, "bookings", lambda now: (window,))
    placement_loop(sync=False)
    victim = Reservation.objects.get(pk__in=idle, reclaim_at__isnull=False)
    assert victim.state == State.RUNNING and abs((victim.reclaim_at - starts).total_seconds()) < 1
    why = f"capacity booked by team vision from {starts:%H:%M} UTC"
    assert why in victim.state_reason and "gets SIGTERM now" in victim.state_reason
    page = browser_for("bob").get(f"/reservations/{victim.pk}/")
    assert page.status_code == 200 and why in page.content.decode()
    [told] = Notification.objects.filter(user__username="bob", event=Event.RECLAIM)
    assert why in told.text
    assert victim.pod_name not in {p.name for p in cluster.list_pods()}  # SIGTERM: on its way out
    assert 540 < graces[victim.pod_name] <= 600  # the time left to the window's start
    assert Reservation.objects.filter(pk__in=idle, reclaim_at__isnull=True).count() == 1
