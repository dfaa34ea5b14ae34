"""Utilization reports: allocated versus used GPU time, per team, node and GPU, only for the teams
a user may see."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from portal.fleet.models import Gpu
from portal.reservations import rules, services
from portal.reservations.models import Allocation
from portal.telemetry.models import GpuMinute, ShareMinute

URL = "/api/v1/reports/utilization/"


@pytest.fixture
def history(fleet, teams, people):
    """vision held 0.5 of T4 #0 for the last 2 hours and used 0.25 of the GPU in each of 60 minutes;
    nlp held 1.0 of T4 #1 for the last hour and used nothing measured."""
    now = timezone.now().replace(second=0, microsecond=0)
    t4_0 = Gpu.objects.get(node__name="t4-node-1", index=0)
    t4_1 = Gpu.objects.get(node__name="t4-node-1", index=1)

    def held(who, team, gpu, share, hours):
        r = services.submit(people[who], rules.ReservationSpec(team=teams[team], image="busybox:1",
                                                               gpu_request=share, gpu_memory_mib=100))
        services.place(r.pk, gpu.node_id, [services.Share(gpu.pk, Decimal(share), 100)])
        Allocation.objects.filter(reservation=r).update(created_at=now - timedelta(hours=hours))
        return r

    vision_r = held("alice", "vision", t4_0, "0.5", 2)
    held("bob", "nlp", t4_1, "1.0", 1)
    for m in range(60):
        ShareMinute.objects.create(reservation=vision_r, gpu=t4_0, team_id=teams["vision"].pk,
                                   minute=now - timedelta(minutes=m + 1), samples=60, used_sum=15.0,
                                   used_max=0.3)
        GpuMinute.objects.create(gpu=t4_0, minute=now - timedelta(minutes=m + 1), samples=60,
                                 sm_util_sum=60 * 50, sm_util_count=60, mem_used_sum=0, mem_used_max=0,
                                 power_sum=0, power_count=0)
    return now


def rows(client, history=None, **params):
    if history is not None:  # a fixed window, so the clock moving on during the test changes nothing
        params = {"since": (history - timedelta(hours=3)).isoformat(), "until": history.isoformat(), **params}
    r = client.get(URL, params)
    assert r.status_code == 200, r.content
    return {row["key"]: row for row in r.json()["rows"]}


def test_team_report_for_staff(client_for, history):
    report = rows(client_for("admin"), history, group_by="team")
    assert report["vision"]["allocated_gpu_hours"] == pytest.approx(1.0, abs=0.01)
    assert report["vision"]["used_gpu_hours"] == pytest.approx(0.25, abs=0.001)
    assert report["vision"]["used_pct"] == pytest.approx(25.0, abs=0.5)
    assert report["nlp"]["allocated_gpu_hours"] == pytest.approx(1.0, abs=0.01)
    assert report["nlp"]["used_gpu_hours"] == 0


def test_manager_sees_only_their_teams(client_for, history):
    report = rows(client_for("dave"), history, group_by="gpu")  # dave manages vision only
    assert len(report) == 1
    (row,) = report.values()
    assert row["allocated_gpu_hours"] == pytest.approx(1.0, abs=0.01)
    assert row["device_busy_gpu_hours"] is None  # device-wide load includes other teams' work
    assert set(rows(client_for("bob"), group_by="team")) == {"nlp"}


def test_node_report_shows_device_load_to_staff(client_for, history):
    report = rows(client_for("admin"), history, group_by="node")
    assert report["t4-node-1"]["allocated_gpu_hours"] == pytest.approx(2.0, abs=0.02)
    assert report["t4-node-1"]["device_busy_gpu_hours"] == pytest.approx(0.5, abs=0.01)


def test_window_clips_allocations(client_for, history):
    since = (history - timedelta(minutes=30)).isoformat()
    report = rows(client_for("admin"), group_by="team", since=since, until=history.isoformat())
    assert report["vision"]["allocated_gpu_hours"] == pytest.approx(0.25, abs=0.01)
    assert report["vision"]["used_gpu_hours"] == pytest.approx(0.125, abs=0.001)


@pytest.mark.parametrize("params", [{"group_by": "planet"}, {"since": "yesterday"},
                                    {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
                                    {"since": "2020-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
                                    {"colour": "red"}])
def test_bad_queries_are_400(client_for, history, params):
    assert client_for("alice").get(URL, params).status_code == 400


def test_odd_time_zone_offsets_are_fine(client_for, history):
    r = client_for("admin").get(URL, {"since": "2026-09-21T14:37:13+17:30", "until": "2026-09-22T00:28:10-04:18"})
    assert r.status_code == 200 and r.json()["since"] == "2026-09-20T21:07:13Z"


def test_report_page_renders_rows(history, people):
    from django.test import Client

    client = Client()
    client.force_login(people["dave"])
    page = client.get("/reports/", {"group_by": "team"})
    assert page.status_code == 200
    assert b'data-key="vision"' in page.content and b'data-key="nlp"' not in page.content
    assert re.search(rb'class="pct">2[45]\.\d %', page.content)


def test_partly_sampled_minute_counts_only_its_seconds(client_for, history, teams):
    from portal.reservations.models import Reservation

    vision_r = Reservation.objects.get(team=teams["vision"])
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    ShareMinute.objects.filter(reservation=vision_r).delete()
    ShareMinute.objects.create(reservation=vision_r, gpu=gpu, team_id=teams["vision"].pk,
                               minute=history - timedelta(minutes=1), samples=10, used_sum=5.0, used_max=0.5)
    report = rows(client_for("admin"), history, group_by="team")
    assert report["vision"]["used_gpu_hours"] == pytest.approx(0.5 * 10 / 3600, abs=1e-4)
