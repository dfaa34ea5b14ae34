"""A reservation's usage over its life: rollups then raw samples, bucketed, the closed buckets
cached without hiding what arrives in the open one."""

from datetime import timedelta
from decimal import Decimal

from django.core.cache import cache
from django.utils import timezone

from portal.telemetry.models import RollupState, ShareMinute, ShareSample
from portal.web.queries import usage_series
from tests.reservations import clock_at, running, submitted


def test_rollups_and_raw_samples_make_one_series(people, teams, fleet):
    cache.clear()
    gpu = fleet.first()
    now = timezone.now().replace(second=30, microsecond=0)
    with clock_at(now - timedelta(minutes=10)):  # placed and running for ten minutes
        r = running(submitted(people["alice"], teams["vision"], image="i", gpu_request=Decimal("0.25"),
                              gpu_limit=Decimal("0.5"), gpu_memory_mib=8192), gpu)
    rolled_to = now.replace(second=0) - timedelta(minutes=2)
    RollupState.objects.create(rolled_up_to=rolled_to)
    for i in range(1, 9):  # minutes placed+1 .. rolled_to: used 0.2, memory 2048 then 4096
        ShareMinute.objects.create(reservation=r, gpu=gpu, team_id=r.team_id, minute=rolled_to - timedelta(minutes=i),
                                   samples=60, used_sum=12.0, used_max=0.3, mem_used_max=2048 if i > 4 else 4096)
    ShareSample.objects.create(reservation=r, gpu=gpu, ts=now - timedelta(seconds=20), used_frac=0.4,
                               mem_used_mib=6144)
    series = usage_series(r, now=now)
    compute, memory = series["compute"], series["memory"]
    assert series["bucket_s"] == 60
    assert compute["series"][0]["values"][:8] == [20.0] * 8
    assert compute["series"][0]["values"][-1] == 40.0 and memory["series"][0]["values"][-1] == 6.0
    assert memory["series"][0]["values"][:4] == [2.0] * 4 and memory["series"][0]["values"][4:8] == [4.0] * 4
    assert compute["series"][1]["values"][0] == 25.0 and compute["series"][2]["values"][0] == 50.0
    assert memory["series"][1]["values"][0] == 8.0
    # A new raw sample in the open bucket shows at once, though the closed buckets come from the cache.
    ShareSample.objects.create(reservation=r, gpu=gpu, ts=now - timedelta(seconds=5), used_frac=0.6)
    again = usage_series(r, now=now)
    assert again["compute"]["series"][0]["values"][-1] == 50.0
    assert again["compute"]["x"][:-1] == compute["x"][:-1]
