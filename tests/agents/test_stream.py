"""The agent against a real WebSocket server: handshake, batches, outages, backoff, placements."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import pytest

from wire.agent_portal import MAX_SAMPLES_PER_BATCH, MAX_UNACKED_BATCHES, PROTOCOL_VERSION

pytestmark = pytest.mark.asyncio


async def test_handshake_carries_the_node_token_and_hello_describes_the_node(portal, agent_tools):
    make_agent, running = agent_tools
    agent = make_agent(portal.url, node="v100-node-1")
    async with running(agent):
        await portal.wait_for(lambda: portal.hellos)
    _, headers = portal.handshakes[0]
    assert headers["Authorization"] == "Bearer node-token-1"
    assert headers["User-Agent"].startswith("tessera-agent/")
    hello = portal.hellos[0]
    assert hello.node == "v100-node-1"
    assert hello.source == "simulated"
    assert hello.interval_ms == 50
    assert hello.stream == agent.stream_id
    assert [g.model for g in hello.gpus] == ["V100-32GB"] * 4
    assert {g.numa_node for g in hello.gpus} == {0, 1}
    by_uuid = {g.uuid: g for g in hello.gpus}
    first = hello.gpus[0]
    assert [by_uuid[p].index for p in first.nvlink_peers] == [1]


async def test_samples_arrive_batched_in_order_and_are_dropped_from_the_buffer_once_acked(
    portal, agent_tools
):
    make_agent, running = agent_tools
    agent = make_agent(portal.url)
    async with running(agent):
        await portal.wait_for(lambda: portal.last_seq >= 30)
    assert portal.refused == []
    assert sorted(portal.stored) == list(range(1, portal.last_seq + 1))
    assert all(1 <= len(b.samples) <= MAX_SAMPLES_PER_BATCH for b in portal.batches)
    assert all(b.stream == agent.stream_id and b.dropped == 0 for b in portal.batches)
    sample = portal.stored[1]
    assert len(sample["gpus"]) == 4
    # The shutdown drained the buffer: everything sampled was acknowledged.
    assert len(agent.buffer) == 0
    assert agent.buffer.acked_seq == agent.sampler.seq


async def test_portal_killed_and_restarted_mid_run_leaves_no_hole_and_no_duplicate(portal, agent_tools):
    make_agent, running = agent_tools
    agent = make_agent(portal.url, interval_s=0.05)
    async with running(agent):
        await portal.wait_for(lambda: portal.last_seq >= 15)
        # Its last acks are lost: the agent still holds samples the portal has already stored.
        portal.acking = False
        unacked_from = portal.last_seq + 1
        await portal.wait_for(lambda: portal.last_seq >= unacked_from + 2)
        await portal.kill()
        portal.acking = True
        assert agent.buffer.first_seq is not None and agent.buffer.first_seq <= unacked_from
        killed_at = portal.last_seq
        await asyncio.sleep(1.5)  # the agent keeps sampling into its buffer meanwhile
        assert agent.sampler.seq > killed_at + 10
        await portal.start()
        await portal.wait_for(lambda: portal.last_seq > killed_at + 40)
    assert portal.refused == []
    assert len(portal.hellos) >= 2
    assert portal.arrivals == sorted(set(portal.arrivals)), "a sample arrived twice or out of order"
    assert sorted(portal.stored) == list(range(1, portal.last_seq + 1))
    times = [portal.stored[s]["ts_ms"] for s in sorted(portal.stored)]
    gaps = [b - a for a, b in pairwise(times)]
    # Sampling went on during the 1.5 s outage: no gap anywhere near its length.
    assert max(gaps) < 700
    assert agent.buffer.dropped == 0


async def test_buffer_overflow_during_an_outage_drops_the_oldest_and_reports_how_many(portal, agent_tools):
    make_agent, running = agent_tools
    await portal.kill()
    # Room for 0.5 s of samples at 20 Hz: 10 samples.
    agent = make_agent(portal.url, interval_s=0.05, buffer_seconds=0.5, backoff=(0.05, 0.1))
    async with running(agent):
        await asyncio.sleep(1.2)
        await portal.start()
        await portal.wait_for(lambda: portal.batches)
    first = portal.batches[0]
    assert first.dropped > 0
    # What is left after the drop starts right after the dropped samples: the loss is exactly counted.
    assert first.samples[0].seq == first.dropped + 1
    assert len(first.samples) <= 10 + 1


async def test_reconnect_backoff_grows_and_is_capped(portal, agent_tools):
    make_agent, running = agent_tools
    portal.token = "a-different-token"  # every handshake is refused with 403
    agent = make_agent(portal.url, backoff=(0.05, 0.4))
    async with running(agent):
        await asyncio.sleep(3.5)
        # Refused connections never stop the sampling.
        assert agent.sampler.seq > 40
    assert portal.hellos == []
    times = [t for t, _ in portal.handshakes]
    gaps = [b - a for a, b in pairwise(times)]
    assert len(gaps) >= 6
    # Attempt n waits between half and all of min(0.4, 0.05 * 2^n): the first waits are short, later
    # ones are at least half the cap and never much over the cap (a little slack for a busy machine).
    assert gaps[0] < 0.2
    assert all(g >= 0.2 for g in gaps[4:])
    assert max(gaps) < 0.4 + 0.6
    assert sum(gaps[:2]) < sum(gaps[-2:])


async def test_placements_pushed_by_the_portal_drive_the_simulated_utilization(portal, agent_tools):
    make_agent, running = agent_tools
    agent = make_agent(portal.url, node="t4-node-1")
    gpu0, gpu1 = (g.uuid for g in agent.hello.gpus)
    pod = "0f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"
    portal.first_messages.append({
        "v": PROTOCOL_VERSION, "type": "placements", "revision": 1,
        "placements": [{"reservation": "r-17", "gpu_uuid": gpu0, "request": 0.2, "limit": 0.3,
                        "memory_mib": 4096, "pod_uid": pod}],
    })
    async with running(agent):
        await portal.wait_for(lambda: agent.placements.revision == 1)
        placed_from = agent.sampler.seq + 1
        await portal.wait_for(lambda: portal.last_seq >= placed_from + 20)
        await portal.push({"v": PROTOCOL_VERSION, "type": "placements", "revision": 2, "placements": []})
        await portal.wait_for(lambda: agent.placements.revision == 2)
        freed_from = agent.sampler.seq + 1
        await portal.wait_for(lambda: portal.last_seq >= freed_from + 5)
    placed = [portal.stored[s] for s in range(placed_from, placed_from + 20)]
    for sample in placed:
        util = {g["uuid"]: g["sm_util_pct"] for g in sample["gpus"]}
        assert util[gpu1] == 0
        assert 0 < util[gpu0] <= 30 + 4  # bounded by the share's limit, plus sensor noise
        (share,) = sample["shares"]
        assert share["reservation"] == "r-17" and share["used_frac"] <= 0.3
        (proc,) = sample["processes"]
        assert (proc["pod_uid"], proc["reservation"], proc["gpu_uuid"]) == (pod, "r-17", gpu0)
        assert proc["mem_used_mib"] <= 4096
    mean = sum(g["sm_util_pct"] for s in placed for g in s["gpus"] if g["uuid"] == gpu0) / len(placed)
    assert mean > 10
    freed = [portal.stored[s] for s in range(freed_from, freed_from + 5)]
    assert all(g["sm_util_pct"] == 0 and g["mem_used_mib"] == 0 for s in freed for g in s["gpus"])
    assert all(s["shares"] == [] and s["processes"] == [] for s in freed)


async def test_bad_placements_are_answered_with_an_error_and_the_connection_survives(portal, agent_tools):
    make_agent, running = agent_tools
    agent = make_agent(portal.url, node="t4-node-1")
    async with running(agent):
        await portal.wait_for(lambda: portal.last_seq >= 3)
        await portal.push({
            "v": PROTOCOL_VERSION, "type": "placements", "revision": 5,
            "placements": [{"reservation": "r-1", "gpu_uuid": "GPU-not-on-this-node", "request": 0.5,
                            "limit": 0.5, "memory_mib": None, "pod_uid": None}],
        })
        await portal.push({"v": PROTOCOL_VERSION, "type": "placements", "revision": 6,
                           "placements": [{"reservation": "r-1"}]})
        await portal.push({"v": 2, "type": "ack"})
        await portal.wait_for(lambda: len(portal.errors_from_agent) >= 3)
        seen = portal.last_seq
        await portal.wait_for(lambda: portal.last_seq >= seen + 5)
    codes = [e["code"] for e in portal.errors_from_agent]
    assert codes == ["unknown_gpu", "invalid_message", "unsupported_version"]
    assert "GPU-not-on-this-node" in portal.errors_from_agent[0]["message"]
    assert "placements[0].gpu_uuid" in portal.errors_from_agent[1]["message"]
    assert agent.placements.revision == -1  # nothing was applied
    assert len(portal.hellos) == 1  # one connection throughout


async def test_after_a_healthy_connection_drops_the_agent_is_back_quickly(portal, agent_tools):
    make_agent, running = agent_tools
    portal.token = "not-yet"  # refused at first: the backoff climbs towards its 5 s cap
    agent = make_agent(portal.url, backoff=(0.1, 5.0))
    async with running(agent):
        await portal.wait_for(lambda: agent.stream.backoff.attempt >= 4)
        portal.token = "node-token-1"
        await portal.wait_for(lambda: portal.last_seq >= 20, timeout=20)  # healthy for > 0.5 s
        await asyncio.sleep(0.6)
        loop = asyncio.get_running_loop()
        dropped = loop.time()
        await portal.kill()
        await portal.start()
        await portal.wait_for(lambda: len(portal.hellos) >= 2, timeout=10)
        back_after = loop.time() - dropped
    # With the reset the first wait is at most 0.1 s; without it, at least 0.1 * 2^4 / 2 = 0.8 s.
    assert back_after < 0.6


async def test_a_batch_the_portal_could_not_store_is_sent_again_after_reconnecting(
    portal, agent_tools, caplog
):
    make_agent, running = agent_tools
    portal.fail_store_at = 12
    agent = make_agent(portal.url)
    async with running(agent):
        await portal.wait_for(lambda: portal.last_seq >= 30)
    assert len(portal.hellos) == 2
    assert sorted(portal.stored) == list(range(1, portal.last_seq + 1))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "portal reports internal: database unavailable" in logged
    assert "received 1011 (internal error) database unavailable" in logged


async def test_the_agent_reports_the_links_it_measures_once_per_session_and_on_change(portal, agent_tools):
    from agents.remote.probe import LinkQuality, LinkTable

    make_agent, running = agent_tools
    agent = make_agent(portal.url)
    measured = iter([9000.0, 9000.0, 4000.0] + [4000.0] * 1000)

    def prober(address: str, gpu_node: str) -> LinkQuality:
        return LinkQuality(gpu_node, 0.3, next(measured), 1_790_000_000.0)

    agent.links = LinkTable({"t4-node-1": "10.0.0.7:7470"}, interval_s=0.2, prober=prober)
    agent.settings.link_check_s = 0.05
    async with running(agent):
        await portal.wait_for(lambda: any(m.links[0].bandwidth_mbps == 4000.0 for m in portal.links))
        await portal.kill()
        count = len(portal.links)
        await portal.start()
        await portal.wait_for(lambda: len(portal.links) > count)  # the new session gets them again
    assert portal.refused == []
    first = portal.links[0]
    assert [(link.gpu_node, link.rtt_ms, link.bandwidth_mbps) for link in first.links] == [("t4-node-1", 0.3, 9000.0)]
    # An unchanged table is not sent again within a session: 9000 twice made one message.
    before_kill = [m.links[0].bandwidth_mbps for m in portal.links[:count]]
    assert before_kill[:2] == [9000.0, 4000.0]


async def test_the_agent_probes_the_servers_the_portal_names_and_drops_those_it_no_longer_names(portal):
    from agents.agent import Agent
    from agents.gpus.none import NoGpuSource
    from agents.placements import PlacementTable
    from agents.remote.probe import LinkQuality, LinkTable

    from .conftest import make_agent, running

    probed = []

    def prober(address: str, gpu_node: str) -> LinkQuality:
        probed.append((gpu_node, address))
        return LinkQuality(gpu_node, 0.3, 9000.0, 1_790_000_000.0)

    settings = make_agent(portal.url).settings
    settings.link_check_s = 0.05
    agent = Agent(settings, NoGpuSource(), PlacementTable(set()),
                  links=LinkTable({}, interval_s=0.2, prober=prober), resources={"cpu_milli": 4000, "memory_mib": 8192})
    async with running(agent):
        await portal.wait_for(lambda: portal.hellos)
        assert portal.hellos[0].gpus == [] and portal.hellos[0].resources.memory_mib == 8192
        await portal.push({"v": 1, "type": "servers", "remote_servers": [
            {"node": "gpu-a", "address": "10.0.0.1:7470"}, {"node": "gpu-b", "address": "10.0.0.2:7470"}]})
        await portal.wait_for(lambda: any(len(m.links) == 2 for m in portal.links))
        await portal.push({"v": 1, "type": "servers",
                           "remote_servers": [{"node": "gpu-a", "address": "10.0.0.1:7470"}]})
        await portal.wait_for(lambda: [link.gpu_node for link in portal.links[-1].links] == ["gpu-a"])
    assert ("gpu-b", "10.0.0.2:7470") in probed and portal.refused == []


async def test_an_ack_lets_a_sender_with_a_full_window_send_the_next_batch(portal, agent_tools):
    make_agent, running = agent_tools
    # One sample a minute: only the ack can wake the sender, not a new sample.
    agent = make_agent(portal.url, interval_s=60.0, buffer_seconds=60.0 * 1000)
    for _ in range((MAX_UNACKED_BATCHES + 1) * MAX_SAMPLES_PER_BATCH):
        agent.buffer.append(*agent.sampler.take())
    portal.acking = False
    async with running(agent):
        await portal.wait_for(lambda: len(portal.batches) == MAX_UNACKED_BATCHES)
        await asyncio.sleep(0.3)
        assert len(portal.batches) == MAX_UNACKED_BATCHES  # the window is full: the sender waits
        portal.acking = True
        await portal.push({"v": PROTOCOL_VERSION, "type": "ack", "stream": agent.stream_id,
                           "seq": portal.batches[0].samples[-1].seq})
        await portal.wait_for(lambda: len(portal.batches) > MAX_UNACKED_BATCHES, timeout=3)
    assert sorted(portal.stored) == list(range(1, portal.last_seq + 1))
