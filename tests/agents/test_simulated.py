"""The simulated GPU set: its load follows the placements, bounded by each share's limit."""

from __future__ import annotations

import json
import random
import statistics
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.gpus.simulated import SimulatedSource, share_usage
from agents.placements import PlacementRefused, PlacementTable
from agents.sampling import Sampler
from wire.agent_portal import Placements
from wire.inventory import load_inventory, pick_node


def setup(demo_inventory, node="a100-node-2", seed=11):
    inventory_node = pick_node(load_inventory(demo_inventory), node, "demo")
    table = PlacementTable({g.uuid for g in inventory_node.gpus})
    return inventory_node, table, SimulatedSource(inventory_node, table, seed=seed)


def place(table, revision, *entries):
    return table.apply(Placements.model_validate({
        "v": 1, "type": "placements", "revision": revision,
        "placements": [{"memory_mib": None, "pod_uid": None, **e} for e in entries],
    }))


def util_series(source, uuid, n=60):
    return [next(g.sm_util_pct for g in source.read().gpus if g.uuid == uuid) for _ in range(n)]


def test_idle_gpus_read_zero(demo_inventory):
    _, _, source = setup(demo_inventory)
    for _ in range(5):
        reading = source.read()
        assert all(g.sm_util_pct == 0 and g.mem_used_mib == 0 for g in reading.gpus)
        assert reading.processes == [] and reading.shares == []
        assert all(0 < g.power_w < 100 for g in reading.gpus)  # idle draw of an A100


def test_utilization_follows_the_placed_shares_and_stays_within_their_limits(demo_inventory):
    node, table, source = setup(demo_inventory)
    g0, g1, g2, _ = (g.uuid for g in node.gpus)
    place(table, 1,
          {"reservation": "small", "gpu_uuid": g0, "request": 0.1, "limit": 0.2},
          {"reservation": "big", "gpu_uuid": g1, "request": 0.5, "limit": 1.0},
          {"reservation": "pair-a", "gpu_uuid": g2, "request": 0.5, "limit": 1.0},
          {"reservation": "pair-b", "gpu_uuid": g2, "request": 0.5, "limit": 1.0})
    readings = [source.read() for _ in range(80)]
    util = {u: [next(g.sm_util_pct for g in r.gpus if g.uuid == u) for r in readings] for u in (g0, g1, g2)}
    assert max(util[g0]) <= 20 + 4  # the limit, plus the sensor's noise
    assert statistics.mean(util[g0]) > 5
    assert statistics.mean(util[g1]) > statistics.mean(util[g0]) + 10
    # Two shares that each may take the whole GPU: together they fill more of it than one alone.
    assert statistics.mean(util[g2]) > statistics.mean(util[g1]) - 5
    for r in readings:
        by_res = {s.reservation: s.used_frac for s in r.shares}
        assert by_res["small"] <= 0.2 and by_res["big"] <= 1.0
        assert by_res["pair-a"] + by_res["pair-b"] <= 1.0 + 1e-9
        gpu_util = {g.uuid: g.sm_util_pct for g in r.gpus}
        # The GPU's utilization is its shares' use, give or take the noise.
        assert abs(gpu_util[g2] - 100 * (by_res["pair-a"] + by_res["pair-b"])) <= 5


def test_memory_stays_under_each_share_cap_and_the_gpu_total(demo_inventory):
    node, table, source = setup(demo_inventory, node="t4-node-1")
    g0 = node.gpus[0].uuid
    place(table, 1, {"reservation": "a", "gpu_uuid": g0, "request": 0.5, "limit": 0.5, "memory_mib": 6000},
          {"reservation": "b", "gpu_uuid": g0, "request": 0.5, "limit": 0.5})
    for _ in range(30):
        reading = source.read()
        mem = {p.reservation: p.mem_used_mib for p in reading.processes}
        assert 0 < mem["a"] <= 6000
        assert 0 < mem["b"] <= 15360 // 2  # no cap: at most its request's part of the GPU
        gpu = next(g for g in reading.gpus if g.uuid == g0)
        assert gpu.mem_used_mib == min(15360, mem["a"] + mem["b"])


def test_removing_a_placement_frees_the_gpu(demo_inventory):
    node, table, source = setup(demo_inventory)
    g0 = node.gpus[0].uuid
    place(table, 1, {"reservation": "r", "gpu_uuid": g0, "request": 0.4, "limit": 0.8})
    assert statistics.mean(util_series(source, g0, 20)) > 10
    place(table, 2)
    assert util_series(source, g0, 5) == [0] * 5


def test_an_older_revision_does_not_undo_a_newer_one(demo_inventory):
    node, table, _ = setup(demo_inventory)
    g0 = node.gpus[0].uuid
    assert place(table, 5, {"reservation": "new", "gpu_uuid": g0, "request": 0.4, "limit": 0.8})
    assert not place(table, 4, {"reservation": "old", "gpu_uuid": g0, "request": 0.4, "limit": 0.8})
    assert [p.reservation for p in table.all()] == ["new"]


def test_placements_on_a_gpu_of_another_node_are_refused_and_change_nothing(demo_inventory):
    node, table, _ = setup(demo_inventory)
    place(table, 1, {"reservation": "keep", "gpu_uuid": node.gpus[0].uuid, "request": 0.4, "limit": 0.8})
    with pytest.raises(PlacementRefused, match="not a GPU of this node") as refused:
        place(table, 2, {"reservation": "x", "gpu_uuid": "GPU-elsewhere", "request": 0.4, "limit": 0.8})
    assert refused.value.code == "unknown_gpu"
    assert [p.reservation for p in table.all()] == ["keep"] and table.revision == 1


shares = st.lists(
    st.tuples(st.floats(0.0, 1.0), st.floats(0.01, 1.0), st.floats(0.0, 1.0)), min_size=1, max_size=8
)


@given(shares)
def test_share_usage_respects_limits_requests_and_the_whole_gpu(raw):
    # Requests scaled so they fit the GPU together, as the placement engine guarantees.
    total_request = sum(r for _, r, _ in raw)
    scale = min(1.0, 1.0 / total_request)
    wants = [w for w, _, _ in raw]
    requests = [r * scale for _, r, _ in raw]
    limits = [r + (1.0 - r) * extra for r, (_, _, extra) in zip(requests, raw, strict=True)]
    used = share_usage(wants, requests, limits)
    assert sum(used) <= 1.0 + 1e-9
    for u, w, r, lim in zip(used, wants, requests, limits, strict=True):
        assert -1e-12 <= u <= min(w, lim) + 1e-9  # never more than it wants or may have
        assert u >= min(w, r) - 1e-9  # always what it wants up to its request


def test_a_new_connection_takes_the_portals_placements_whatever_their_revision(demo_inventory):
    node, table, _ = setup(demo_inventory)
    g0 = node.gpus[0].uuid
    place(table, 900, {"reservation": "before-restart", "gpu_uuid": g0, "request": 0.4, "limit": 0.8})
    table.new_connection()  # the portal restarted and counts from 1 again
    assert place(table, 1, {"reservation": "after-restart", "gpu_uuid": g0, "request": 0.4, "limit": 0.8})
    assert [p.reservation for p in table.all()] == ["after-restart"]


class PlainSimulation:
    """The simulation as its docstring describes it, written the plain way, with its own random
    generator: an independent check that SimulatedSource's shortcuts (placements grouped once per
    message, power model looked up once) change no value it reports."""

    POWER = {"A100-80GB": (55, 400), "V100-32GB": (40, 300)}  # idle and maximum watts

    def __init__(self, node, seed):
        self.node = node
        self.rng = random.Random(seed)
        self.demand = {}
        self.temp = {g.uuid: 32.0 for g in node.gpus}

    def read(self, placed):
        live = {p.reservation for p in placed}
        for gone in set(self.demand) - live:
            del self.demand[gone]
        for reservation in live:
            level = 0.35 + 0.65 * (zlib.crc32(b"level:" + reservation.encode()) % 1000) / 999
            d = self.demand.get(reservation, level)
            d += 0.3 * (level - d) + self.rng.gauss(0.0, 0.06)
            self.demand[reservation] = min(1.0, max(0.0, d))
        gpus, processes, shares = [], [], []
        for gpu in self.node.gpus:
            on_gpu = [p for p in placed if p.gpu_uuid == gpu.uuid]
            want = [max(0.0, min(self.demand[p.reservation], p.limit)) for p in on_gpu]
            if sum(want) <= 1.0:
                used = want
            else:  # each gets up to its request, the rest in proportion to what it still wants
                base = [min(w, p.request) for w, p in zip(want, on_gpu, strict=True)]
                spare = max(0.0, 1.0 - sum(base))
                excess = [w - b for w, b in zip(want, base, strict=True)]
                used = [b + spare * e / sum(excess) for b, e in zip(base, excess, strict=True)]
            mem_total = 0
            for p, frac in zip(on_gpu, used, strict=True):
                cap = p.memory_mib or int(gpu.memory_mib * p.request)
                mem = min(cap, 420 + int(cap * (0.5 + 0.4 * self.demand[p.reservation])))
                mem_total += mem
                pid = 100_000 + zlib.crc32(p.reservation.encode()) % 3_000_000
                processes.append({"pid": pid, "gpu_uuid": gpu.uuid, "mem_used_mib": mem,
                                  "sm_util_pct": round(100 * frac), "pod_uid": p.pod_uid,
                                  "container_id": None, "reservation": p.reservation})
                shares.append({"reservation": p.reservation, "gpu_uuid": gpu.uuid,
                               "used_frac": round(frac, 4), "mem_used_mib": mem})
            util = 0 if not on_gpu else max(0, min(100, round(100 * sum(used) + self.rng.gauss(0.0, 1.0))))
            idle_w, max_w = self.POWER[gpu.model]
            power = idle_w + (max_w - idle_w) * util / 100
            power = max(0.0, power + self.rng.gauss(0.0, max_w * 0.005))
            self.temp[gpu.uuid] += 0.15 * (32.0 + 48.0 * util / 100 - self.temp[gpu.uuid])
            gpus.append({"uuid": gpu.uuid, "sm_util_pct": util, "mem_util_pct": max(0, min(100, round(util * 0.6))),
                         "mem_used_mib": min(gpu.memory_mib, mem_total), "power_w": round(power, 1),
                         "temp_c": round(self.temp[gpu.uuid])})
        return {"gpus": gpus, "processes": processes, "shares": shares}


@pytest.mark.parametrize(("node", "seed"), [("a100-node-2", 11), ("a100-node-1", 12345), ("v100-node-1", 3)])
def test_samples_are_exactly_those_of_the_plainly_written_model(demo_inventory, node, seed):
    inventory_node, table, source = setup(demo_inventory, node=node, seed=seed)
    plain = PlainSimulation(inventory_node, seed)
    sampler = Sampler(source, table, clock=lambda: 1_790_000_000.0)
    uuids = [g.uuid for g in inventory_node.gpus]
    pod = "0f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"
    phases = [
        [],
        # Two shares that want more than the GPU together, a capped one with a pod, a two-GPU job.
        [{"reservation": "pair-a", "gpu_uuid": uuids[0], "request": 0.5, "limit": 1.0},
         {"reservation": "pair-b", "gpu_uuid": uuids[0], "request": 0.3, "limit": 0.9},
         {"reservation": "capped", "gpu_uuid": uuids[1], "request": 0.25, "limit": 0.5,
          "memory_mib": 6000, "pod_uid": pod},
         {"reservation": "wide", "gpu_uuid": uuids[-1], "request": 0.25, "limit": 0.75}],
        # One leaves, one arrives, the two-GPU job now spans two GPUs (its demand is shared).
        [{"reservation": "pair-a", "gpu_uuid": uuids[0], "request": 0.5, "limit": 1.0},
         {"reservation": "late", "gpu_uuid": uuids[0], "request": 0.5, "limit": 0.6},
         {"reservation": "wide", "gpu_uuid": uuids[1], "request": 0.25, "limit": 0.75},
         {"reservation": "wide", "gpu_uuid": uuids[-1], "request": 0.25, "limit": 0.75}],
        [],
        [{"reservation": "capped", "gpu_uuid": uuids[0], "request": 1.0, "limit": 1.0, "memory_mib": 6000}],
    ]
    seq = 0
    for revision, entries in enumerate(phases, start=1):
        assert place(table, revision, *entries)
        for _ in range(25):
            seq += 1
            expected = plain.read(table.all())
            assert sampler.take() == (seq, json.dumps(
                {"seq": seq, "ts_ms": 1_790_000_000_000, **expected}, separators=(",", ":"), allow_nan=False
            ))
