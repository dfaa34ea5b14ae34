"""The demo's week of usage history: made through the services, read by every report, and
seeded once however often the demo starts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from portal.reservations.models import Allocation, Reservation
from portal.telemetry.models import GpuMinute, ShareMinute
from portal.web.demo_history import seed_week

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def history(fleet, teams, people):
    return seed_week(now=NOW)


def test_a_week_of_past_reservations_every_one_ended(history):
    assert history > 40
    past = Reservation.objects.filter(name__startswith="hist-")
    assert past.count() == history
    assert not past.exclude(state__in=["succeeded", "failed", "cancelled"]).exists()
    assert not Allocation.objects.filter(reservation__in=past, released_at__isnull=True).exists()
    first = past.order_by("created_at").first().created_at
    assert NOW - timedelta(days=7) <= first < NOW - timedelta(days=6)
    assert {r.team.slug for r in past.select_related("team")} == {"vision", "nlp"}


def test_seeding_again_adds_nothing(history):
    counts = (Reservation.objects.count(), ShareMinute.objects.count(), GpuMinute.objects.count())
    assert seed_week(now=NOW) == 0
    assert seed_week(now=NOW + timedelta(days=1)) == 0
    assert (Reservation.objects.count(), ShareMinute.objects.count(), GpuMinute.objects.count()) == counts


def test_every_report_has_something_to_show(history, client_for):
    admin = client_for("admin")
    window = {"since": "2026-11-13", "until": "2026-11-20"}
    usage = admin.get("/api/v1/reports/usage/", window).json()
    rows = {r["key"]: r for r in usage["rows"]}
    for team in ("vision", "nlp"):
        assert rows[team]["allocated_gpu_hours"] > 10 and rows[team]["used_gpu_hours"] > 1
        assert 0 < rows[team]["used_gpu_hours"] < rows[team]["allocated_gpu_hours"] * 2
    assert usage["total"]["idle_allocated_gpu_hours"] > 0  # some shares sat idle
    assert usage["total"]["burst_gpu_hours"] > 0  # some used more than they asked for
    overview = admin.get("/api/v1/reports/overview/", window).json()
    allocated = [sum(s["allocated"][i] for s in overview["series"]["teams"].values())
                 for i in range(len(overview["series"]["edges"]) - 1)]
    assert sum(1 for a in allocated if a > 0) > len(allocated) // 2  # the chart is not flat
