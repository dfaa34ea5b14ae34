"""Per-minute rollups, late samples, retention and the periodic task."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from portal.telemetry import agent_batches, ingest, streams
from portal.telemetry.models import GpuMinute, GpuSample, RollupState, ShareMinute, ShareSample
from portal.telemetry.rollups import apply_retention, roll_up
from portal.telemetry.services import recent_utilization
from portal.telemetry.tasks import maintain_telemetry
from portal.telemetry.upkeep import maintain

from .conftest import hello_for, samples_for

pytestmark = pytest.mark.django_db


def _minute_ago(minutes: int) -> datetime:
    return timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=minutes)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def test_a_minute_rolls_up_into_sums_and_counts(node, placed):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    start = _minute_ago(5)
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(1, 31), util=30,
                                                              ts_ms=_ms(start), step_ms=2000,
                                                              shares=[(placed["vision"].pk, 0, 0.25)]))])
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(31, 61), util=90,
                                                              ts_ms=_ms(start + timedelta(minutes=1)),
                                                              step_ms=2000))])
    assert roll_up() > 0
    gpu0 = node.gpus.get(index=0)
    first, second = GpuMinute.objects.filter(gpu=gpu0).order_by("minute")
    assert (first.minute, first.samples, first.sm_util_sum / first.sm_util_count) == (start, 30, 30)
    assert (second.samples, second.sm_util_max, second.mem_used_max) == (30, 90, 1000)
    share = ShareMinute.objects.get()
    assert (share.samples, share.team_id, share.used_sum) == (30, placed["vision"].team_id, pytest.approx(7.5))
    # Running it again changes nothing (the rollups are recomputed, not added to).
    roll_up()
    assert GpuMinute.objects.filter(gpu=gpu0).count() == 2
    assert ShareMinute.objects.get().samples == 30


def test_samples_replayed_after_their_minute_was_rolled_up_are_counted(node):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    minute = _minute_ago(4)
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(1, 11),
                                                              ts_ms=_ms(minute)))])
    roll_up()
    assert GpuMinute.objects.get(gpu__index=0, minute=minute).samples == 10
    # An agent's buffered samples of that minute arrive after a portal outage.
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(11, 21),
                                                              ts_ms=_ms(minute + timedelta(seconds=20))))])
    roll_up()
    assert GpuMinute.objects.get(gpu__index=0, minute=minute).samples == 20


def test_retention_drops_raw_rows_only_once_rolled_up(node, settings):
    settings.TESSERA_TELEMETRY_RAW_RETENTION_S = 600
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    old = _minute_ago(30)
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(1, 6), ts_ms=_ms(old)))])
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(6, 8)))])
    assert apply_retention()["gpu_samples"] == 0  # nothing rolled up yet: raw rows are all there is
    roll_up()
    deleted = apply_retention()
    assert deleted["gpu_samples"] == 5 * 8
    assert GpuSample.objects.filter(ts__lt=old + timedelta(minutes=1)).count() == 0
    assert GpuMinute.objects.filter(minute=old).count() == 8  # the minute outlives its raw rows


def test_minute_rollups_expire_after_their_retention(node, settings):
    settings.TESSERA_TELEMETRY_MINUTE_RETENTION_DAYS = 1
    gpu = node.gpus.first()
    for days in (0, 2):
        GpuMinute.objects.create(gpu=gpu, minute=_minute_ago(60 * 24 * days + 5), samples=1, sm_util_sum=1,
                                 sm_util_count=1, mem_used_sum=1, mem_used_max=1, power_sum=0, power_count=0)
    assert apply_retention()["gpu_minutes"] == 1
    assert GpuMinute.objects.count() == 1


def test_recent_utilization_spans_rollups_and_raw_rows(node, placed, settings):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    r = placed["vision"].pk
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(1, 21),
                                                              ts_ms=_ms(_minute_ago(20)), shares=[(r, 0, 0.1)]))])
    roll_up()
    ShareSample.objects.all().delete()  # as if raw retention had passed: only the minutes are left
    # The last 10 s: newer than anything a rollup may have covered.
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(21, 41), step_ms=500,
                                                              ts_ms=_ms(timezone.now()) - 10_000,
                                                              shares=[(r, 0, 0.5)]))])
    use = recent_utilization([r], timezone.now() - timedelta(hours=1))
    assert use[r] == pytest.approx(0.3)  # 20 samples at 0.1 (from a minute rollup) and 20 at 0.5
    assert RollupState.objects.get().rolled_up_to is not None


def test_the_periodic_task_rolls_up_and_marks_silent_nodes_lost(node):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    ingest.store_batches([agent_batches.reduce(info, samples_for(node, hello.stream, range(1, 4),
                                                              ts_ms=_ms(_minute_ago(3))))])
    type(node).objects.filter(pk=node.pk).update(last_seen=timezone.now() - timedelta(hours=1))
    type(node).objects.exclude(pk=node.pk).filter(name="a100-node-2").update(last_seen=timezone.now())
    result = maintain_telemetry.apply().get()
    assert result["lost"] == [node.name] and result["rolled_up"] >= 8
    assert maintain()["lost"] == []  # already lost: not again

