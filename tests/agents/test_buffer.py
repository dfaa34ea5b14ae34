"""The local buffer: bounded, drops the oldest when full (counted), forgets only what was acked."""

from __future__ import annotations

import json

import pytest

from agents.agent import DEFAULT_BUFFER_BYTES, DEFAULT_BUFFER_SECONDS
from agents.buffer import SampleBuffer
from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from agents.sampling import Sampler
from wire.agent_portal import Placements
from wire.inventory import load_inventory, pick_node


def fill(buffer, first, last):
    for seq in range(first, last + 1):
        buffer.append(seq, json.dumps({"seq": seq}))


def test_samples_leave_only_when_acknowledged_and_replay_in_order():
    buffer = SampleBuffer(max_samples=100, max_bytes=10**6)
    fill(buffer, 1, 30)
    assert [e.seq for e in buffer.after(0, 10, 10**6)] == list(range(1, 11))
    assert [e.seq for e in buffer.after(25, 10, 10**6)] == [26, 27, 28, 29, 30]
    assert buffer.ack(12) == 12
    assert buffer.first_seq == 13 and buffer.acked_seq == 12
    # Replay after a reconnect starts right after what the portal has.
    assert [e.seq for e in buffer.after(12, 60, 10**6)][:3] == [13, 14, 15]
    assert buffer.ack(5) == 0 and buffer.acked_seq == 12  # an old ack changes nothing
    assert buffer.ack(30) == 18 and len(buffer) == 0 and buffer.size_bytes == 0


def test_a_full_buffer_drops_the_oldest_and_counts_them():
    buffer = SampleBuffer(max_samples=10, max_bytes=10**6)
    fill(buffer, 1, 25)
    assert len(buffer) == 10 and buffer.dropped == 15
    assert (buffer.first_seq, buffer.last_seq) == (16, 25)
    assert buffer.after(3, 60, 10**6)[0].seq == 16


def test_the_byte_bound_holds_too():
    buffer = SampleBuffer(max_samples=10**6, max_bytes=1000)
    for seq in range(1, 101):
        buffer.append(seq, "x" * 95)
    assert buffer.size_bytes <= 1000 and buffer.dropped == 90


def test_batches_respect_the_byte_budget_but_always_carry_one_sample():
    buffer = SampleBuffer(max_samples=100, max_bytes=10**6)
    for seq in range(1, 11):
        buffer.append(seq, "y" * 100)
    assert len(buffer.after(0, 60, 350)) == 3
    assert len(buffer.after(0, 60, 10)) == 1


def test_sequence_numbers_must_follow_on():
    buffer = SampleBuffer(max_samples=10, max_bytes=10**6)
    fill(buffer, 1, 3)
    with pytest.raises(ValueError, match="does not follow"):
        buffer.append(5, "{}")


def test_the_default_bound_holds_fifteen_minutes_of_a_busy_eight_gpu_node(demo_inventory):
    node = pick_node(load_inventory(demo_inventory), "a100-node-1", "demo")
    table = PlacementTable({g.uuid for g in node.gpus})
    # Four shares on every GPU: 32 processes and 32 share readings in each sample.
    table.apply(Placements.model_validate({"v": 1, "type": "placements", "revision": 1, "placements": [
        {"reservation": f"r{g.index}-{k}", "gpu_uuid": g.uuid, "request": 0.25, "limit": 0.5,
         "memory_mib": 8192, "pod_uid": None} for g in node.gpus for k in range(4)]}))
    sampler = Sampler(SimulatedSource(node, table, seed=1), table)
    seconds = int(DEFAULT_BUFFER_SECONDS)
    buffer = SampleBuffer(max_samples=seconds, max_bytes=DEFAULT_BUFFER_BYTES)
    for _ in range(seconds):
        buffer.append(*sampler.take())
    assert buffer.dropped == 0 and len(buffer) == seconds >= 600
    assert buffer.size_bytes < DEFAULT_BUFFER_BYTES / 4
