"""The reports overview: the fleet now (allocation, utilization, free / partly allocated / stranded
GPUs, who waits and why) and the queueing delay; scoped to the teams a manager may see."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.fleet.models import Gpu
from portal.reports.overview import percentile, why_waiting
from portal.reservations import services
from portal.telemetry.models import RollupState, ShareMinute
from tests.reservations import clock_at, placed, submitted

URL = "/api/v1/reports/overview/"


def submit(people, teams, who, team, share, memory=100, model=""):
    return submitted(people[who], teams[team], image="busybox:1", gpu_request=share, gpu_memory_mib=memory,
                     gpu_model=model)


def place(r, gpu, share, memory=100):
    placed(r, gpu, share, memory)


@pytest.fixture
def fleet_now(fleet, teams, people):
    """vision holds 0.5 of T4 #0 and uses 0.25 of it; nlp holds all of T4 #1; vision waits for
    0.75 of a T4, which T4 #0's half cannot give."""
    t4_0, t4_1 = (Gpu.objects.get(node__name="t4-node-1", index=i) for i in (0, 1))
    held = submit(people, teams, "alice", "vision", "0.5")
    place(held, t4_0, "0.5")
    place(submit(people, teams, "bob", "nlp", "1.0"), t4_1, "1.0")
    waiting = submit(people, teams, "alice", "vision", "0.75", model="T4")
    services.note_pending_reason(waiting.pk, "2 GPU(s) have less than 0.75 of compute free")
    end = timezone.now().replace(second=0, microsecond=0)
    RollupState.objects.create(rolled_up_to=end)
    ShareMinute.objects.bulk_create([
        ShareMinute(reservation=held, gpu=t4_0, team_id=held.team_id, minute=end - timedelta(minutes=m + 1),
                    samples=60, used_sum=15.0, used_max=0.25) for m in range(5)])
    return {"held": held, "waiting": waiting}


def test_now_for_a_manager(client_for, fleet_now):
    data = client_for("dave").get(URL, {"range": "24h"}).json()
    now = data["now"]
    gpus = Gpu.objects.count()
    assert now["gpus"] == gpus
    assert now["allocated_gpus"] == 0.5  # vision's only: nlp's whole T4 is not dave's number
    assert now["allocation_pct"] == round(100 * 0.5 / gpus, 1)
    assert now["used_gpus"] == 0.25 and now["utilization_pct"] == 50.0
    t4 = next(m for m in now["by_model"] if m["model"] == "T4")
    assert t4 == {"model": "T4", "gpus": 2, "allocated_gpus": 0.5, "allocation_pct": 25.0, "used_gpus": 0.25,
                  "utilization_pct": 50.0}
    # T4 #0 has half its compute left, but the only waiting request needs 0.75: stranded.
    assert now["gpu_states"] == {"free": gpus - 2, "partly_allocated": 0, "stranded": 1, "full": 1}


def test_a_fitting_request_makes_the_leftover_partly_allocated(client_for, fleet_now, teams, people):
    submit(people, teams, "bob", "nlp", "0.25")
    assert client_for("admin").get(URL).json()["now"]["gpu_states"]["partly_allocated"] == 1


def test_waiting_requests_oldest_and_why(client_for, fleet_now, teams, people):
    other = submit(people, teams, "bob", "nlp", "0.5")
    services.note_pending_reason(other.pk, "over team nlp's quota of 1.5 GPUs")
    with clock_at(timezone.now() + timedelta(hours=2)):  # alice's request has waited two hours
        waiting = client_for("dave").get(URL).json()["waiting"]
    assert waiting["count"] == 1 and waiting["by_reason"] == {"no fit": 1}  # nlp's wait is not dave's
    assert 7190 <= waiting["oldest_wait_s"] <= 7300
    assert waiting["oldest"][0]["owner"] == "alice" and waiting["oldest"][0]["why"] == "no fit"
    assert client_for("admin").get(URL).json()["waiting"]["by_reason"] == {"no fit": 1, "quota": 1}


@pytest.mark.parametrize("reason, why", [
    ("over team nlp's quota of 1.5 GPUs", "quota"), ("waiting for the next placement cycle", "not yet considered"),
    ("3 GPU(s) hold shares of another exclusion group (this request: secure)", "exclusion"),
    ("2 GPU(s) have less than 8192 MiB of GPU memory free", "no fit")])
def test_why_waiting_classes(reason, why):
    assert why_waiting(reason) == why


def test_queueing_delay_percentiles(client_for, fleet, teams, people):
    now = timezone.now()
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    for wait_s in (60, 120, 300):  # submitted, then placed an hour ago after waiting wait_s
        with clock_at(now - timedelta(hours=1, seconds=wait_s)):
            r = submit(people, teams, "alice", "vision", "0.1")
        with clock_at(now - timedelta(hours=1)):
            place(r, gpu, "0.1")
    (vision,) = [q for q in client_for("dave").get(URL).json()["queueing"]]
    # Linear between ranks: p50 = 120 s; p90 = 120 + 0.8 × (300 - 120) = 264 s.
    assert vision == {"team": "vision", "placed": 3, "p50_wait_s": 120.0, "p90_wait_s": 264.0}


def test_percentile_edges():
    assert percentile([], 0.5) is None and percentile([7.0], 0.9) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def test_overview_series_is_stacked_by_the_visible_teams(client_for, fleet_now):
    assert set(client_for("dave").get(URL).json()["series"]["teams"]) == {"vision"}
    assert set(client_for("admin").get(URL).json()["series"]["teams"]) == {"vision", "nlp"}


def test_overview_refuses_group_by(client_for, fleet_now):
    assert client_for("dave").get(URL, {"group_by": "team"}).status_code == 400


def test_utilization_now_compares_used_and_allocated_over_the_same_minutes(client_for, fleet_now, teams, people):
    # The reported case: T4 shares hard-capped at 0.5. One ended two minutes ago after using all of
    # its half; the other still holds its half and uses it fully. Allocated *now* is 0.5, but the
    # minutes read for "used" hold both: 1.0 + 0.6 GPU-minutes a minute ÷ 0.5 read 154.6 % (> 100 %
    # for shares that can never pass their limit). Over the same minutes it is 100 %.
    t4_1 = Gpu.objects.get(node__name="t4-node-1", index=1)
    end = RollupState.objects.get().rolled_up_to
    ShareMinute.objects.filter(reservation=fleet_now["held"]).update(used_sum=30.0, used_max=0.5)
    ended = submit(people, teams, "carol", "vision", "0.5")
    ShareMinute.objects.bulk_create([
        ShareMinute(reservation=ended, gpu=t4_1, team_id=ended.team_id, minute=end - timedelta(minutes=m + 1),
                    samples=60, used_sum=30.0, used_max=0.5) for m in range(2, 5)])
    services.cancel(ended.pk, people["carol"])  # it holds nothing now: only its minutes are left
    now = client_for("dave").get(URL).json()["now"]
    assert now["allocated_gpus"] == 0.5
    assert now["used_gpus"] == pytest.approx(0.5 + 0.5 * 3 / 5)
    assert now["utilization_pct"] == 100.0
    t4 = next(m for m in now["by_model"] if m["model"] == "T4")
    assert t4["utilization_pct"] == 100.0
