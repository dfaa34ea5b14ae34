"""Bookings in the reports: booked, used and no-show GPU-hours per team in the usage report, and
their totals in the overview, scoped to the teams the reader may see."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from portal.fleet.models import Gpu
from portal.reservations import services
from portal.reservations.states import State
from tests.portal.test_reports import use
from tests.reservations import SYSTEM, clock_at, placed

USAGE = "/api/v1/reports/usage/"
OVERVIEW = "/api/v1/reports/overview/"


@pytest.fixture
def past_bookings(fleet, people, teams, booked):
    """Three days ago, vision: a whole T4 booked 09:00–11:00, placed at 09:01, its processes using
    60% of the GPU until it ended at 10:00;
    half a T4 booked 12:00–14:00, placed at 12:00 and released as a no-show at 12:20; and a booking
    cancelled before its start. nlp booked nothing."""
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
    t4 = Gpu.objects.filter(model="T4").order_by("pk")
    with clock_at(day - timedelta(days=1)):
        [early] = booked(people["alice"], teams["vision"], day + timedelta(hours=9), 2)
        [absent] = booked(people["alice"], teams["vision"], day + timedelta(hours=12), 2, gpu_request=Decimal("0.5"))
        [dropped] = booked(people["alice"], teams["vision"], day + timedelta(hours=15), 2)
        services.cancel_booking(dropped.pk, people["alice"])
    with clock_at(day + timedelta(hours=9)):
        services.start_due()
    with clock_at(day + timedelta(hours=9, minutes=1)):
        placed(early, t4[0])
        assert services.move(early.pk, State.PLACED, State.RUNNING, "its pod runs", SYSTEM)
    use(early, t4[0], day + timedelta(hours=9, minutes=1), 59, 0.6)
    with clock_at(day + timedelta(hours=10)):
        services.cancel_booking(early.pk, people["alice"])
    with clock_at(day + timedelta(hours=12)):
        services.start_due()
        placed(absent, t4[1])
    with clock_at(day + timedelta(hours=12, minutes=20)):
        assert services.release_no_show(absent.pk, 20)
    return day


def test_the_usage_report_has_booked_used_and_no_show_hours_per_team(client_for, past_bookings):
    report = client_for("admin").get(USAGE, {"range": "7d"}).json()
    by_team = {b["team"]: b for b in report["bookings"]}
    # held: the share from its placing to its end; used: what the processes used (the no-show none)
    assert by_team["vision"] == {"team": "vision", "booked_gpu_hours": 3.0,
                                 "held_gpu_hours": pytest.approx(59 / 60 + 0.5 * 20 / 60, abs=0.001),
                                 "used_gpu_hours": pytest.approx(0.6 * 59 / 60, abs=0.001),
                                 "no_show_gpu_hours": 1.0}
    assert by_team["nlp"] == {"team": "nlp", "booked_gpu_hours": 0.0, "held_gpu_hours": 0.0, "used_gpu_hours": 0.0,
                              "no_show_gpu_hours": 0.0}
    assert "no-shows" in report["bookings_rule"]


def test_a_window_that_covers_part_of_a_booking_counts_that_part(client_for, past_bookings):
    day = past_bookings
    report = client_for("admin").get(USAGE, {"since": (day + timedelta(hours=10)).isoformat(),
                                             "until": (day + timedelta(hours=13)).isoformat()}).json()
    vision = next(b for b in report["bookings"] if b["team"] == "vision")
    assert vision["booked_gpu_hours"] == 1.5  # 10–11 of the whole T4, 12–13 of the half
    assert vision["no_show_gpu_hours"] == 0.5


def test_used_hours_are_what_the_processes_used_within_the_reports_window(client_for, past_bookings):
    day = past_bookings
    report = client_for("admin").get(USAGE, {"since": (day + timedelta(hours=9, minutes=30)).isoformat(),
                                             "until": (day + timedelta(hours=10, minutes=30)).isoformat()}).json()
    vision = next(b for b in report["bookings"] if b["team"] == "vision")
    assert vision["held_gpu_hours"] == 0.5  # 09:30–10:00 of the whole T4
    assert vision["used_gpu_hours"] == pytest.approx(0.3, abs=0.001)  # at 60% of it


def test_the_overview_has_the_booking_totals_of_the_managers_teams(client_for, past_bookings):
    data = client_for("dave").get(OVERVIEW, {"range": "7d"}).json()
    assert data["bookings"]["booked_gpu_hours"] == 3.0 and data["bookings"]["no_show_gpu_hours"] == 1.0
    bob_side = client_for("erin").get(USAGE, {"range": "7d"}).json()
    assert [b["team"] for b in bob_side["bookings"]] == ["nlp"]


def test_the_pages_show_the_bookings(people, past_bookings):
    from django.test import Client

    client = Client()
    client.force_login(people["dave"])
    usage = client.get("/reports/?range=7d").content.decode()
    assert "<h2 id=\"bookings-title\">Bookings</h2>" in usage and "3.00" in usage
    overview = client.get("/reports/overview/?range=7d").content.decode()
    assert "Bookings: 3.00 GPU-h booked" in overview and "1.00 GPU-h no-show" in overview
    assert "0.59 GPU-h really used" in overview
