"""What ingest writes (one COPY text block per commit on PostgreSQL) is what the agent sent:
every value, NULLs, exact floats and millisecond timestamps; replays within one commit stored once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from portal.fleet.models import Gpu
from portal.telemetry import agent_batches, ingest, streams
from portal.telemetry.models import AgentStream, GpuSample, ShareSample
from wire.agent_portal import MAX_MEMORY_MIB, Samples

from .conftest import hello_for, samples_for

pytestmark = pytest.mark.django_db


def _batch(stream: str, seq: int, ts_ms: int, gpus: list[dict], shares: list[dict]) -> Samples:
    return Samples.model_validate({"v": 1, "type": "samples", "stream": stream, "dropped": 3, "samples": [
        {"seq": seq, "ts_ms": ts_ms, "gpus": gpus, "processes": [], "shares": shares}]})


def test_every_value_round_trips_through_copy_including_nulls(node, placed):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    gpu0, gpu1, gpu2 = (Gpu.objects.get(node=node, index=i) for i in range(3))
    ts_ms = int(timezone.now().timestamp() * 1000) - 1234  # not on a whole second
    readings = [
        {"uuid": gpu0.uuid, "sm_util_pct": None, "mem_util_pct": None, "mem_used_mib": 0, "power_w": None,
         "temp_c": None},
        {"uuid": gpu1.uuid, "sm_util_pct": 100, "mem_util_pct": 0, "mem_used_mib": MAX_MEMORY_MIB,
         "power_w": 0.1 + 0.2, "temp_c": -40},
        {"uuid": gpu2.uuid, "sm_util_pct": 7, "mem_util_pct": 99, "mem_used_mib": 1, "power_w": 1e-05, "temp_c": 150},
    ]
    shares = [{"reservation": str(placed["vision"].pk), "gpu_uuid": gpu0.uuid, "used_frac": 1 / 3,
               "mem_used_mib": None},
              {"reservation": str(placed["nlp"].pk), "gpu_uuid": gpu1.uuid, "used_frac": 0.0, "mem_used_mib": 7}]
    stored = ingest.store_batches([agent_batches.reduce(info, _batch(hello.stream, 1, ts_ms, readings, shares))])[0]
    assert (stored.ack_seq, stored.new_samples) == (1, 1)

    ts = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ts_ms)
    rows = {r[0]: r[1:] for r in GpuSample.objects.values_list(
        "gpu_id", "stream_id", "seq", "ts", "sm_util_pct", "mem_util_pct", "mem_used_mib", "power_w", "temp_c")}
    assert rows == {
        gpu0.pk: (info.stream_pk, 1, ts, None, None, 0, None, None),
        gpu1.pk: (info.stream_pk, 1, ts, 100, 0, MAX_MEMORY_MIB, 0.1 + 0.2, -40),  # the same double, not 0.3
        gpu2.pk: (info.stream_pk, 1, ts, 7, 99, 1, 1e-05, 150),
    }
    assert set(ShareSample.objects.values_list("reservation_id", "gpu_id", "ts", "used_frac", "mem_used_mib")) == {
        (placed["vision"].pk, gpu0.pk, ts, 1 / 3, None), (placed["nlp"].pk, gpu1.pk, ts, 0.0, 7)}
    stream = AgentStream.objects.get(pk=info.stream_pk)
    assert (stream.last_seq, stream.dropped, stream.last_sample_at) == (1, 3, ts)


def test_overlapping_batches_of_one_stream_in_one_commit_are_stored_once(node):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    first = samples_for(node, hello.stream, range(1, 4))
    replay = samples_for(node, hello.stream, range(2, 6))  # 2 and 3 again, then 4 and 5
    again = samples_for(node, hello.stream, range(1, 3))
    results = ingest.store_batches([agent_batches.reduce(info, m) for m in (first, replay, again)])
    assert [(r.ack_seq, r.new_samples) for r in results] == [(3, 3), (5, 2), (2, 0)]
    per_seq = sorted(GpuSample.objects.filter(stream_id=info.stream_pk).values_list("seq", flat=True).distinct())
    assert per_seq == [1, 2, 3, 4, 5]
    assert GpuSample.objects.count() == 5 * Gpu.objects.filter(node=node).count()
    assert results[2].latest is None and results[1].latest.ts_ms == replay.samples[-1].ts_ms


def test_readings_of_gpus_outside_the_hello_are_not_stored(node):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    other = Gpu.objects.exclude(node=node).first()
    mine = Gpu.objects.get(node=node, index=0)
    reading = {"sm_util_pct": 1, "mem_util_pct": 1, "mem_used_mib": 1, "power_w": 1.0, "temp_c": 1}
    ts_ms = int(timezone.now().timestamp() * 1000)
    batch = _batch(hello.stream, 1, ts_ms, [{"uuid": other.uuid, **reading}, {"uuid": mine.uuid, **reading}], [])
    stored = ingest.store_batches([agent_batches.reduce(info, batch)])[0]
    assert list(GpuSample.objects.values_list("gpu_id", flat=True)) == [mine.pk]
    assert [g[0] for g in stored.latest.gpus] == [mine.pk]


def test_a_sample_exactly_at_the_clock_limit_is_accepted_and_one_ms_later_refused(node):
    now = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    skew = timedelta(minutes=5)
    limit_ms = int((now + skew).timestamp() * 1000)  # the limit is 123.456 ms into its second
    stream = "3c66582e-e581-4e1d-aa74-80ea6746c195"
    assert agent_batches.too_far_ahead(_batch(stream, 1, limit_ms, [], []), now=now, skew=skew) is None
    assert agent_batches.too_far_ahead(_batch(stream, 1, limit_ms + 1, [], []), now=now, skew=skew) == (
        f"samples: samples[0].ts_ms: {limit_ms + 1} is more than 300 s in the future (check the node's clock)")
