"""Usage reports: allocated versus used GPU time, idle, burst and opportunistic time, by team, user,
node, GPU model or reservation; hand-computed cases, the hourly pre-aggregation agreeing with the
minutes, and scoping (managers see their teams; members get no reports; nothing leaks)."""

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
from django.utils import timezone

from portal.fleet.models import Gpu
from portal.telemetry import hours
from portal.telemetry.models import GpuDay, GpuMinute, RollupState, ShareHour, ShareMinute
from tests.reservations import clock_at, ended, placed, submitted

URL = "/api/v1/reports/usage/"
T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)  # a fixed past Monday: windows never touch "now"


def gpu(node, index=0):
    return Gpu.objects.get(node__name=node, index=index)


def hold(people, teams, who, team, on, share, start, end=None, limit=None, priority=50, admission="guaranteed"):
    """A reservation of `who` holding `share` of GPU `on` from start to end (None: still held),
    admitted as `admission`."""
    with clock_at(start):
        r = placed(submitted(people[who], teams[team], image="busybox:1", gpu_request=share, gpu_limit=limit or share,
                             gpu_memory_mib=100, priority=priority), on, admission=admission)
    if end is not None:
        with clock_at(end):
            ended(r)
    return r


def use(r, on, start, minutes, used, samples=60):
    """Minute rollups: the share used `used` of the GPU in each of `minutes` minutes from start."""
    ShareMinute.objects.bulk_create([
        ShareMinute(reservation=r, gpu=on, team_id=r.team_id, minute=start + timedelta(minutes=m), samples=samples,
                    used_sum=used * samples, used_max=used) for m in range(minutes)])


def busy(on, start, minutes, sm_pct):
    GpuMinute.objects.bulk_create([
        GpuMinute(gpu=on, minute=start + timedelta(minutes=m), samples=60, sm_util_sum=60 * sm_pct,
                  sm_util_count=60, mem_used_sum=0, mem_used_max=0, power_sum=0, power_count=0)
        for m in range(minutes)])


def report(client, since=T0 - timedelta(hours=1), until=T0 + timedelta(hours=4), **params):
    r = client.get(URL, {"since": since.isoformat(), "until": until.isoformat(), **params})
    assert r.status_code == 200, r.content
    return r.json()


def by_key(data):
    return {row["key"]: row for row in data["rows"]}


@pytest.fixture
def two_hours(fleet, teams, people):
    """vision (alice) held 0.5 of T4 #0 for 2 hours from T0, using 0.25 of the GPU in the first
    hour; nlp (bob) held 1.0 of T4 #1 for the first hour, using nothing measured."""
    t4_0, t4_1 = gpu("t4-node-1", 0), gpu("t4-node-1", 1)
    vision = hold(people, teams, "alice", "vision", t4_0, "0.5", T0, T0 + timedelta(hours=2))
    nlp = hold(people, teams, "bob", "nlp", t4_1, "1.0", T0, T0 + timedelta(hours=1))
    use(vision, t4_0, T0, 60, 0.25)
    busy(t4_0, T0, 60, 50)
    return {"vision": vision, "nlp": nlp}


def test_share_of_half_for_two_hours_is_one_gpu_hour(client_for, two_hours):
    rows = by_key(report(client_for("admin")))
    assert rows["vision"]["allocated_gpu_hours"] == 1.0
    assert rows["vision"]["used_gpu_hours"] == 0.25
    assert rows["vision"]["used_pct"] == 25.0
    assert rows["nlp"]["allocated_gpu_hours"] == 1.0 and rows["nlp"]["used_gpu_hours"] == 0


def test_window_clips_a_reservation_crossing_both_edges(client_for, two_hours):
    data = report(client_for("admin"), since=T0 + timedelta(minutes=30), until=T0 + timedelta(minutes=90))
    rows = by_key(data)
    assert rows["vision"]["allocated_gpu_hours"] == 0.5  # 0.5 × 1 h
    assert rows["vision"]["used_gpu_hours"] == 0.125  # 0.25 × the 30 measured minutes inside
    assert rows["nlp"]["allocated_gpu_hours"] == 0.5  # 1.0 × 30 min
    assert data["total"]["allocated_gpu_hours"] == 1.0


def test_burst_above_request_is_over_100_percent_with_a_note(client_for, fleet, teams, people):
    t4 = gpu("t4-node-1")
    r = hold(people, teams, "alice", "vision", t4, "0.25", T0, T0 + timedelta(hours=1), limit="0.75")
    use(r, t4, T0, 60, 0.5)
    row = by_key(report(client_for("dave")))["vision"]
    assert row["allocated_gpu_hours"] == 0.25 and row["used_gpu_hours"] == 0.5
    assert row["used_pct"] == 200.0
    assert row["burst_gpu_hours"] == 0.25  # 0.5 - 0.25 for an hour
    assert "burst above their request" in row["note"] and "limit" in row["note"]


def test_idle_allocated_is_the_time_under_the_team_threshold(client_for, fleet, teams, people):
    t4 = gpu("t4-node-1")
    teams["vision"].idle_threshold = Decimal("0.05")
    teams["vision"].save()
    r = hold(people, teams, "alice", "vision", t4, "0.5", T0, T0 + timedelta(hours=1))
    use(r, t4, T0, 30, 0.02)  # idle: under 5 % of the GPU
    use(r, t4, T0 + timedelta(minutes=30), 30, 0.3)
    data = report(client_for("dave"))
    assert by_key(data)["vision"]["idle_allocated_gpu_hours"] == 0.25  # 0.5 × half an hour
    (top,) = data["top_idle"]
    assert top["reservation"] == r.pk and top["owner"] == "alice" and top["idle_pct"] == 50.0


def test_minutes_without_measurements_are_not_idle(client_for, fleet, teams, people):
    hold(people, teams, "alice", "vision", gpu("t4-node-1"), "0.5", T0, T0 + timedelta(hours=1))
    data = report(client_for("dave"))
    assert by_key(data)["vision"]["idle_allocated_gpu_hours"] == 0 and data["top_idle"] == []


def test_opportunistic_and_borrowed_hours(client_for, fleet, teams, people):
    hold(people, teams, "alice", "vision", gpu("t4-node-1", 1), "0.5", T0, T0 + timedelta(hours=2))
    hold(people, teams, "alice", "vision", gpu("t4-node-1"), "0.5", T0, T0 + timedelta(hours=2), priority=0,
         admission="opportunistic")
    hold(people, teams, "alice", "vision", gpu("a100-node-1"), "0.25", T0, T0 + timedelta(hours=2),
         admission="borrowed")
    data = report(client_for("dave"))
    row = by_key(data)["vision"]
    assert row["allocated_gpu_hours"] == 2.5 and row["opportunistic_gpu_hours"] == 1.0
    assert row["borrowed_gpu_hours"] == 0.5
    assert data["total"]["borrowed_gpu_hours"] == 0.5


def test_partly_sampled_minute_counts_only_its_seconds(client_for, fleet, teams, people):
    t4 = gpu("t4-node-1")
    r = hold(people, teams, "alice", "vision", t4, "0.5", T0, T0 + timedelta(hours=1))
    use(r, t4, T0, 1, 0.5, samples=10)
    assert by_key(report(client_for("dave")))["vision"]["used_gpu_hours"] == round(0.5 * 10 / 3600, 4)


@pytest.mark.parametrize("group_by, key, allocated", [
    ("user", "alice", 1.0), ("node", "t4-node-1", 2.0), ("gpu_model", "T4", 2.0)])
def test_other_groupings(client_for, two_hours, group_by, key, allocated):
    assert by_key(report(client_for("admin"), group_by=group_by))[key]["allocated_gpu_hours"] == allocated


def test_group_by_reservation_names_the_owner(client_for, two_hours):
    row = by_key(report(client_for("dave"), group_by="reservation"))[str(two_hours["vision"].pk)]
    assert "alice" in row["label"] and row["allocated_gpu_hours"] == 1.0


def test_device_busy_hours_only_for_site_admins(client_for, two_hours):
    assert by_key(report(client_for("admin"), group_by="node"))["t4-node-1"]["device_busy_hours"] == 0.5
    data = report(client_for("dave"), group_by="node")
    assert data["total"]["device_busy_hours"] is None  # the device's load includes other teams' work


def test_hourly_rollups_give_the_same_numbers_as_the_minutes(client_for, two_hours, teams, people):
    t4 = gpu("t4-node-1")
    r = hold(people, teams, "alice", "vision", t4, "0.25", T0 + timedelta(minutes=20), T0 + timedelta(hours=3),
             limit="1.0")
    use(r, t4, T0 + timedelta(minutes=20), 100, 0.6)
    use(r, t4, T0 + timedelta(minutes=120), 60, 0.01)
    windows = [(T0 - timedelta(minutes=13), T0 + timedelta(minutes=200)), (T0, T0 + timedelta(hours=3))]
    before = [report(client_for("admin"), since=a, until=b) for a, b in windows]
    hours.fold(T0 - timedelta(hours=1), T0 + timedelta(hours=4))
    RollupState.objects.create(rolled_up_to=T0 + timedelta(hours=4), hours_rolled_up_to=T0 + timedelta(hours=4))
    assert ShareHour.objects.count() == 4  # vision: 1 hour; the second share: 3 hours
    ShareMinute.objects.filter(minute__gte=T0, minute__lt=T0 + timedelta(hours=3)).delete()  # whole hours: from hours
    after = [report(client_for("admin"), since=a, until=b) for a, b in windows]
    for b, a in zip(before, after, strict=True):
        assert by_key(a) == by_key(b) and a["total"] == b["total"]


def test_device_load_from_days_hours_and_minutes_agrees(client_for, fleet, teams, people):
    t4 = gpu("t4-node-1")
    hold(people, teams, "alice", "vision", t4, "0.5", T0, T0 + timedelta(hours=48))
    busy(t4, T0, 48 * 60, 25)  # 48 hours at 25 % SM from Monday 08:00: all of Tuesday (UTC) among them
    window = {"since": T0 + timedelta(minutes=7), "until": T0 + timedelta(hours=46, minutes=50)}
    before = report(client_for("admin"), group_by="gpu_model", **window)
    hours.fold(T0, T0 + timedelta(hours=48))
    RollupState.objects.create(rolled_up_to=T0 + timedelta(hours=48), hours_rolled_up_to=T0 + timedelta(hours=48))
    assert GpuDay.objects.filter(day=datetime(2026, 11, 3, tzinfo=UTC)).count() == 1
    # Tuesday is read from its day row, the whole hours around it from hours, the edges from minutes.
    GpuMinute.objects.filter(minute__gte=T0 + timedelta(hours=1), minute__lt=T0 + timedelta(hours=46)).delete()
    after = report(client_for("admin"), group_by="gpu_model", **window)
    assert by_key(after)["T4"]["device_busy_hours"] == by_key(before)["T4"]["device_busy_hours"]
    assert by_key(after)["T4"]["device_busy_hours"] == round(0.25 * (46 * 60 + 50 - 7) / 60, 4)


def test_series_buckets_add_up_to_the_totals(client_for, two_hours):
    data = report(client_for("admin"), since=T0 - timedelta(hours=1), until=T0 + timedelta(hours=3))
    assert data["series"]["bucket_hours"] == 1 and len(data["series"]["edges"]) == 5
    vision = data["series"]["teams"]["vision"]
    assert vision["allocated"] == [0, 0.5, 0.5, 0] and vision["used"] == [0, 0.25, 0, 0]


def test_dates_are_read_in_the_time_zone(client_for, two_hours):
    # In Kolkata (+05:30) 2026-11-02 runs from 2026-11-01T18:30Z to 2026-11-02T18:30Z.
    data = client_for("admin").get(URL, {"since": "2026-11-02", "until": "2026-11-02", "tz": "Asia/Kolkata"}).json()
    assert data["since"] == "2026-11-01T18:30:00Z" and data["until"] == "2026-11-02T18:30:00Z"
    assert data["time_zone"] == "Asia/Kolkata"
    assert by_key(data)["vision"]["allocated_gpu_hours"] == 1.0
    local = client_for("admin").get(URL, {"since": "2026-11-02T13:00", "until": "2026-11-02T14:00",
                                          "tz": "Asia/Kolkata"}).json()  # 07:30 to 08:30 UTC
    assert by_key(local)["vision"]["allocated_gpu_hours"] == 0.25


def test_day_buckets_follow_the_zone_across_daylight_saving(client_for, two_hours):
    # New York leaves daylight saving on 2026-11-01: that day has 25 hours.
    data = client_for("admin").get(URL, {"since": "2026-10-20", "until": "2026-11-05", "tz": "America/New_York"}).json()
    edges = [datetime.fromisoformat(e.replace("Z", "+00:00")) for e in data["series"]["edges"]]
    assert data["series"]["bucket_hours"] == 24
    lengths = {(b - a).total_seconds() / 3600 for a, b in pairwise(edges)}
    assert lengths == {24.0, 25.0}
    assert edges[0].hour == 4 and edges[-1].hour == 5  # EDT midnight, then EST midnight


# Scoping


def test_managers_see_only_their_teams(client_for, two_hours):
    data = report(client_for("dave"), group_by="node")
    assert data["teams"] == ["vision"]
    # The node also held nlp's share: none of it shows in dave's row or totals.
    assert by_key(data)["t4-node-1"]["allocated_gpu_hours"] == 1.0 and data["total"]["allocated_gpu_hours"] == 1.0
    assert report(client_for("carol"))["teams"] == ["vision"]  # team admins too
    assert set(by_key(report(client_for("admin")))) == {"vision", "nlp"}


@pytest.mark.parametrize("who", ["alice", "bob"])
def test_members_get_no_reports(client_for, two_hours, who):
    for url in (URL, "/api/v1/reports/overview/"):
        r = client_for(who).get(url)
        assert r.status_code == 403 and "managers" in r.json()["detail"]


def test_another_teams_filter_is_refused_like_a_missing_team(client_for, two_hours):
    other = client_for("dave").get(URL, {"team": "nlp"})
    missing = client_for("dave").get(URL, {"team": "nosuch"})
    assert other.status_code == missing.status_code == 400
    assert other.json()["team"] == [m.replace("nosuch", "nlp") for m in missing.json()["team"]]
    assert report(client_for("admin"), team="nlp")["teams"] == ["nlp"]


@pytest.mark.parametrize("params", [
    {"group_by": "planet"}, {"since": "yesterday"}, {"since": "2026-01-02", "until": "2026-01-01"},
    {"since": "2020-01-01", "until": "2026-01-01"}, {"colour": "red"}, {"range": "1y"},
    {"range": "7d", "since": "2026-01-01"}, {"tz": "Mars/Olympus"}, {"team": ""}, {"format": "xml"},
    {"since": "2026-13-45"}])
def test_bad_queries_are_400_with_a_message(client_for, two_hours, params):
    r = client_for("dave").get(URL, params)
    assert r.status_code == 400, r.content
    assert all(isinstance(v, list) and v for v in r.json().values())


def test_odd_offsets_are_fine(client_for, two_hours):
    r = client_for("admin").get(URL, {"since": "2026-09-21T14:37:13+17:30", "until": "2026-09-22T00:28:10-04:18"})
    assert r.status_code == 200 and r.json()["since"] == "2026-09-20T21:07:13Z"


# CSV


def test_csv_has_units_and_the_same_totals_as_json(client_for, two_hours):
    params = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=4)).isoformat(),
              "group_by": "node"}
    client = client_for("admin")
    data = client.get(URL, params).json()
    r = client.get(URL, {**params, "format": "csv"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    assert "attachment" in r["Content-Disposition"]
    table = list(csv.reader(io.StringIO(r.content.decode())))
    assert table[0][:3] == ["node", "allocated (GPU-hours)", "used (GPU-hours)"] and "device busy (hours)" in table[0]
    assert table[-1][0] == "Total"
    assert float(table[-1][1]) == data["total"]["allocated_gpu_hours"]
    assert float(table[-1][2]) == data["total"]["used_gpu_hours"]
    assert len(table) == len(data["rows"]) + 2


def test_overview_csv_totals_match(client_for, two_hours):
    params = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=4)).isoformat()}
    data = client_for("dave").get("/api/v1/reports/overview/", params).json()
    r = client_for("dave").get("/api/v1/reports/overview/", {**params, "format": "csv"})
    table = list(csv.reader(io.StringIO(r.content.decode())))
    assert table[0][0] == "bucket start (UTC)" and table[-1][0] == "Total"
    assert float(table[-1][2]) == data["total"]["allocated_gpu_hours"] == 1.0
    assert sum(float(row[2]) for row in table[1:-1]) == pytest.approx(1.0)
    assert {row[1] for row in table[1:-1]} == {"vision"}


def test_hour_rollups_fold_from_maintain(fleet, teams, people):
    from portal.telemetry.rollups import roll_up

    now = timezone.now().replace(second=0, microsecond=0)
    start = hours.floor_hour(now) - timedelta(hours=3)
    t4 = gpu("t4-node-1")
    r = hold(people, teams, "alice", "vision", t4, "0.5", start)
    use(r, t4, start, 120, 0.4)
    RollupState.objects.create(rolled_up_to=now - timedelta(minutes=1))
    roll_up(now)
    row = ShareHour.objects.get(hour=start)
    assert row.sampled_minutes == 60 and row.used == pytest.approx(24.0) and row.over_request == 0
    assert RollupState.objects.get().hours_rolled_up_to >= start + timedelta(hours=2)


def test_a_late_minute_refolds_its_hour(fleet, teams, people):
    from portal.telemetry.models import LateMinute, ShareSample
    from portal.telemetry.rollups import roll_up

    now = timezone.now().replace(second=0, microsecond=0)
    hour = hours.floor_hour(now) - timedelta(hours=2)
    t4 = gpu("t4-node-1")
    r = hold(people, teams, "alice", "vision", t4, "0.5", hour)
    use(r, t4, hour, 60, 0.25)
    RollupState.objects.create(rolled_up_to=hours.floor_hour(now), hours_rolled_up_to=hour + hours.HOUR)
    hours.fold(hour, hour + hours.HOUR)
    assert ShareHour.objects.get(hour=hour).used == pytest.approx(15.0)
    # Samples of minute :05 arrive after an outage: that minute is recomputed from them, and its hour too.
    late = hour + timedelta(minutes=5)
    ShareSample.objects.bulk_create([ShareSample(reservation=r, gpu=t4, ts=late + timedelta(seconds=s), used_frac=0.85)
                                     for s in range(60)])
    LateMinute.objects.create(minute=late)
    roll_up(now)
    assert ShareHour.objects.get(hour=hour).used == pytest.approx(15.0 - 0.25 + 0.85)
