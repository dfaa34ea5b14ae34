"""A booking at its start: the periodic task makes it pending within one tick; a booking nobody
uses in its first minutes (no process on its GPU) is released and its owner told why."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from portal.fleet.models import Gpu
from portal.placement import bookings
from portal.reservations.models import Allocation, Reservation, StateTransition
from portal.reservations.states import State
from portal.telemetry.models import ShareSample
from portal.tenancy.models import TeamPolicy
from tests.reservations import SYSTEM, clock_at, placed


def _started(people, teams, booked, day):
    """alice's half T4 booked at `day`, started and placed at day + 1 min, running."""
    from portal.reservations import services

    [r] = booked(people["alice"], teams["vision"], day, 2, gpu_request=Decimal("0.5"))
    gpu = Gpu.objects.filter(model="T4").order_by("pk").first()
    with clock_at(day + timedelta(seconds=3)):
        assert bookings.tick() == {"drains_started": 0, "drains_ended": 0, "started": 1, "missed": 0, "no_shows": 0}
    with clock_at(day + timedelta(minutes=1)):
        r = placed(r, gpu)
        assert services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", SYSTEM)
    return Reservation.objects.get(pk=r.pk), gpu


def _samples(r, gpu, at, used: float, memory: int | None):
    ShareSample.objects.bulk_create([ShareSample(reservation=r, gpu=gpu, ts=at + timedelta(seconds=s),
                                                 used_frac=used, mem_used_mib=memory) for s in range(0, 600, 10)])


def test_the_tick_starts_a_due_booking_and_asks_for_a_cycle(fleet, people, teams, booked, day, monkeypatch):
    asked = []
    monkeypatch.setattr("portal.reservations.services.moving.request_cycle", lambda reason, **how: asked.append(reason))
    [r] = booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.5"))
    with clock_at(day + timedelta(seconds=9)):
        assert bookings.tick()["started"] == 1
    r.refresh_from_db()
    assert r.state == State.PENDING and asked


def test_a_booking_with_no_process_in_its_first_minutes_is_released(fleet, people, teams, booked, day):
    TeamPolicy.objects.create(team=teams["vision"], booking_no_show_min=10)
    r, gpu = _started(people, teams, booked, day)
    _samples(r, gpu, r.placed_at, used=0.0, memory=0)  # reported, but nothing runs on it
    with clock_at(r.placed_at + timedelta(minutes=9)):
        assert bookings.check_no_shows() == 0  # not yet: its first 10 minutes are not over
    with clock_at(r.placed_at + timedelta(minutes=10, seconds=5)):
        assert bookings.check_no_shows() == 1
    r.refresh_from_db()
    assert r.state == State.EXPIRED
    assert r.state_reason.startswith("no-show: no process used its GPU in the first 10 min")
    last = StateTransition.objects.filter(reservation=r).last()
    assert (last.from_state, last.to_state) == ("running", "expired") and last.reason == r.state_reason
    assert not Allocation.objects.filter(reservation=r, released_at__isnull=True).exists()


def test_a_booking_whose_owner_shows_up_is_kept(fleet, people, teams, booked, day):
    r, gpu = _started(people, teams, booked, day)
    _samples(r, gpu, r.placed_at, used=0.0, memory=600)  # a process holds memory: it came
    with clock_at(r.placed_at + timedelta(minutes=20, seconds=5)):
        assert bookings.check_no_shows() == 0
    r.refresh_from_db()
    assert r.state == State.RUNNING


def test_no_readings_at_all_is_not_a_no_show(fleet, people, teams, booked, day):
    r, _ = _started(people, teams, booked, day)
    with clock_at(r.placed_at + timedelta(minutes=20, seconds=5)):
        assert bookings.check_no_shows() == 0
    r.refresh_from_db()
    assert r.state == State.RUNNING


def test_a_reservation_that_was_not_booked_is_never_a_no_show(fleet, people, teams):
    from tests.reservations import running, submitted

    r = running(submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.5"), gpu_memory_mib=1024),
                Gpu.objects.filter(model="T4").first())
    _samples(r, Gpu.objects.filter(model="T4").first(), r.placed_at, used=0.0, memory=0)
    with clock_at(r.placed_at + timedelta(minutes=20, seconds=5)):
        assert bookings.check_no_shows() == 0


def test_team_admins_set_the_no_show_minutes_within_bounds(client_for, people, teams):
    url = "/api/v1/teams/vision/policy/"
    assert client_for("carol").get(url).json()["booking_no_show_min"] == 20
    r = client_for("carol").patch(url, {"booking_no_show_min": 45}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["booking_no_show_min"] == 45
    r = client_for("carol").patch(url, {"booking_no_show_min": 0}, format="json")
    assert r.status_code == 400 and "between 1 and 1440" in " ".join(r.json()["booking_no_show_min"])
    assert client_for("alice").patch(url, {"booking_no_show_min": 30}, format="json").status_code == 403
