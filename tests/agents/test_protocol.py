"""Message validation: what the agent sends passes, what breaks the rules is refused with a reason."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from agents.sampling import Sampler
from agents.stream import PortalStream, websocket_url
from wire.agent_portal import (
    AGENT_MESSAGES,
    MAX_MESSAGE_BYTES,
    MAX_SAMPLES_PER_BATCH,
    PORTAL_MESSAGES,
    Placements,
    ProtocolError,
    Samples,
    error_message,
    parse,
    parse_slow,
)
from wire.inventory import load_inventory, pick_node

STREAM = "3c66582e-e581-4e1d-aa74-80ea6746c195"
GPU = "GPU-e4ad3e86-d2fd-5887-b483-8cd513bef9e0"


def sample(seq: int) -> dict:
    return {
        "seq": seq,
        "ts_ms": 1_795_307_908_073 + seq * 1000,
        "gpus": [{"uuid": GPU, "sm_util_pct": 37, "mem_util_pct": 22, "mem_used_mib": 3110,
                  "power_w": 32.8, "temp_c": 41}],
        "processes": [{"pid": 4242, "gpu_uuid": GPU, "mem_used_mib": 3110, "sm_util_pct": 37,
                       "pod_uid": "0f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b", "container_id": None,
                       "reservation": "42"}],
        "shares": [{"reservation": "42", "gpu_uuid": GPU, "used_frac": 0.37, "mem_used_mib": 3110}],
    }


def batch(first: int = 1, count: int = 3) -> dict:
    return {"v": 1, "type": "samples", "stream": STREAM, "dropped": 0,
            "samples": [sample(first + i) for i in range(count)]}


def placements(*entries: dict) -> dict:
    return {"v": 1, "type": "placements", "revision": 3, "placements": list(entries)}


def placement(**overrides) -> dict:
    entry = {"reservation": "42", "gpu_uuid": GPU, "request": 0.25, "limit": 0.5, "memory_mib": 4096,
             "pod_uid": None}
    entry.update(overrides)
    return entry


def test_a_well_formed_batch_is_accepted():
    message = parse(json.dumps(batch()), AGENT_MESSAGES)
    assert isinstance(message, Samples)
    assert [s.seq for s in message.samples] == [1, 2, 3]


def test_what_the_agent_actually_sends_passes_validation(demo_inventory):
    node = pick_node(load_inventory(demo_inventory), "a100-node-1", "demo")
    table = PlacementTable({g.uuid for g in node.gpus})
    table.apply(Placements.model_validate(placements(
        placement(gpu_uuid=node.gpus[0].uuid, request=0.5, limit=1.0),
        placement(reservation="43", gpu_uuid=node.gpus[0].uuid, request=0.5, limit=1.0, memory_mib=None),
    )))
    sampler = Sampler(SimulatedSource(node, table, seed=3), table)
    from agents.buffer import SampleBuffer

    buffer = SampleBuffer(max_samples=100, max_bytes=10**7)
    for _ in range(5):
        buffer.append(*sampler.take())
    stream = PortalStream(url="ws://x/", token="t", hello="", node=node.name, stream_id=STREAM,
                          buffer=buffer, placements=table)
    last_seq, text = stream.next_batch(0)
    message = parse(text, AGENT_MESSAGES)
    assert isinstance(message, Samples) and last_seq == 5
    assert len(message.samples[0].gpus) == 8
    assert {s.reservation for s in message.samples[0].shares} == {"42", "43"}


@pytest.mark.parametrize(
    ("mutate", "code", "says"),
    [
        (lambda m: m.update(v=2), "unsupported_version", "v must be 1"),
        (lambda m: m.update(type="sample"), "invalid_message", "type must be one of"),
        (lambda m: m.update(colour="red"), "invalid_message", "colour: Extra inputs are not permitted"),
        (lambda m: m["samples"][1].update(seq=7), "invalid_message",
         "samples[1].seq: expected 2 (consecutive), got 7"),
        (lambda m: m["samples"][0]["gpus"][0].update(sm_util_pct=101), "invalid_message",
         "samples[0].gpus[0].sm_util_pct"),
        (lambda m: m["samples"][0]["gpus"][0].update(sm_util_pct=37.5), "invalid_message",
         "sm_util_pct"),
        (lambda m: m["samples"][0]["gpus"][0].update(mem_used_mib="3110"), "invalid_message",
         "mem_used_mib"),
        (lambda m: m["samples"][0]["gpus"][0].pop("power_w"), "invalid_message",
         "samples[0].gpus[0].power_w: Field required"),
        (lambda m: m["samples"][0].update(ts_ms=1_000), "invalid_message", "ts_ms"),
        (lambda m: m["samples"][0]["processes"][0].update(pod_uid="not-a-uid"), "invalid_message",
         "pod_uid"),
        (lambda m: m["samples"][0]["shares"][0].update(used_frac=1.5), "invalid_message", "used_frac"),
        (lambda m: m.update(stream="node-1"), "invalid_message", "stream"),
        (lambda m: m.update(samples=[]), "invalid_message", "samples"),
        (lambda m: m["samples"][0]["gpus"].append(dict(m["samples"][0]["gpus"][0])), "invalid_message",
         "duplicate uuid"),
    ],
)
def test_malformed_samples_are_refused_with_the_field_named(mutate, code, says):
    message = batch()
    mutate(message)
    with pytest.raises(ProtocolError) as refused:
        parse(json.dumps(message), AGENT_MESSAGES)
    assert refused.value.code == code
    assert says in str(refused.value)


def test_a_batch_over_the_sample_limit_is_refused():
    with pytest.raises(ProtocolError, match="at most 60 items"):
        parse(json.dumps(batch(count=MAX_SAMPLES_PER_BATCH + 1)), AGENT_MESSAGES)


def test_an_oversized_frame_is_refused_before_it_is_parsed():
    raw = '{"v":1,"type":"samples","pad":"' + "x" * MAX_MESSAGE_BYTES + '"}'
    with pytest.raises(ProtocolError) as refused:
        parse(raw, AGENT_MESSAGES)
    assert refused.value.code == "too_large"


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", "42", b'{"v": 1}'])
def test_frames_that_are_not_a_json_object_in_text_are_refused(raw):
    with pytest.raises(ProtocolError) as refused:
        parse(raw, AGENT_MESSAGES)
    assert refused.value.code == "bad_json"


def test_each_direction_accepts_only_its_own_messages():
    welcome = {"v": 1, "type": "welcome", "node": "n1", "stream": STREAM, "acked_seq": 0}
    assert parse(json.dumps(welcome), PORTAL_MESSAGES).type == "welcome"
    with pytest.raises(ProtocolError, match="type must be one of"):
        parse(json.dumps(welcome), AGENT_MESSAGES)
    with pytest.raises(ProtocolError, match="type must be one of"):
        parse(json.dumps(batch()), PORTAL_MESSAGES)


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([placement(limit=0.1)], "limit 0.1 is below request 0.25"),
        ([placement(request=0)], "request"),
        ([placement(limit=1.5)], "limit"),
        ([placement(request=0.6, limit=0.6), placement(reservation="43", request=0.5, limit=0.5)],
         "add up to 1.100"),
        ([placement(), placement()], "the same reservation twice"),
        ([placement(reservation="has space")], "reservation"),
        ([placement(memory_mib=0)], "memory_mib"),
    ],
)
def test_inconsistent_placements_are_refused(entries, says):
    with pytest.raises(ProtocolError) as refused:
        parse(json.dumps(placements(*entries)), PORTAL_MESSAGES)
    assert refused.value.code == "invalid_message"
    assert says in str(refused.value)


def test_requests_that_fill_a_gpu_exactly_are_accepted_despite_float_rounding():
    entries = [placement(reservation=str(i), request=0.1, limit=0.1) for i in range(10)]
    assert len(parse(json.dumps(placements(*entries)), PORTAL_MESSAGES).placements) == 10


def test_error_messages_are_valid_and_truncated_to_the_limit():
    text = error_message("invalid_message", "x" * 5000, ref_seq=9)
    parsed = parse(text, AGENT_MESSAGES)
    assert parsed.code == "invalid_message" and len(parsed.message) == 1024 and parsed.ref_seq == 9
    with pytest.raises(ProtocolError, match="code"):
        parse(json.dumps({"v": 1, "type": "error", "code": "oops", "message": "", "fatal": False}),
              AGENT_MESSAGES)


def test_hello_with_a_peer_that_is_not_on_the_node_is_refused():
    hello = {"v": 1, "type": "hello", "node": "n1", "stream": STREAM, "agent_version": "0.1.0",
             "source": "nvml", "driver_version": "550.54", "interval_ms": 1000,
             "gpus": [{"index": 0, "uuid": GPU, "model": "T4", "memory_mib": 15360, "numa_node": None,
                       "nvlink_peers": ["GPU-elsewhere"], "mig_mode": "disabled"}]}
    with pytest.raises(ProtocolError, match="not a GPU of this node"):
        parse(json.dumps(hello), AGENT_MESSAGES)
    fixed = copy.deepcopy(hello)
    fixed["gpus"][0]["nvlink_peers"] = []
    assert parse(json.dumps(fixed), AGENT_MESSAGES).node == "n1"


@pytest.mark.parametrize(
    ("portal", "url"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/agents/"),
        ("https://tessera.example.org/", "wss://tessera.example.org/ws/agents/"),
        ("https://example.org/tessera", "wss://example.org/tessera/ws/agents/"),
        ("wss://example.org/custom/path/", "wss://example.org/custom/path/"),
    ],
)
def test_portal_addresses_map_to_the_agents_endpoint(portal, url):
    assert websocket_url(portal) == url


@pytest.mark.parametrize(
    ("portal", "says"),
    [("ftp://x", "must start with"), ("http://", "no host"), ("http://x:99999", "port"),
     ("http://x/?a=1", "query")],
)
def test_bad_portal_addresses_are_refused(portal, says):
    with pytest.raises(ValueError, match=says):
        websocket_url(portal)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=40) | st.sampled_from([GPU, STREAM, "42", 1.0, 0, 100, 101, -1]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, (*path, i))
    yield path


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_fast_and_the_careful_validation_agree(data):
    message = data.draw(st.sampled_from([batch(count=2), placements(placement())]))
    allowed = PORTAL_MESSAGES if message["type"] == "placements" else AGENT_MESSAGES
    paths = [p for p in leaves(message) if p]
    path = data.draw(st.sampled_from(paths))
    target = message
    for key in path[:-1]:
        target = target[key]
    if data.draw(st.booleans()):
        target[path[-1]] = data.draw(json_values)
    elif isinstance(target, dict):
        del target[path[-1]]
    raw = json.dumps(message)
    try:
        slow = parse_slow(raw, allowed)
    except ProtocolError:
        slow = None
    try:
        fast = parse(raw, allowed)
    except ProtocolError:
        fast = None
    assert fast == slow


def test_a_hello_without_gpus_carries_the_nodes_resources_within_bounds():
    hello = {"v": 1, "type": "hello", "node": "cpu-node-1", "stream": STREAM, "agent_version": "0.1.0",
             "source": "none", "driver_version": None, "interval_ms": 10000, "gpus": [],
             "resources": {"cpu_milli": 64000, "memory_mib": 257_000}}
    parsed = parse(json.dumps(hello), AGENT_MESSAGES)
    assert parsed.gpus == [] and parsed.resources.cpu_milli == 64000
    for bad, says in (({"cpu_milli": 0, "memory_mib": 1}, "cpu_milli"),
                      ({"cpu_milli": 1000, "memory_mib": 2**40}, "memory_mib"),
                      ({"cpu_milli": "4", "memory_mib": 1024}, "cpu_milli"),
                      ({"cpu_milli": 1000}, "memory_mib")):
        with pytest.raises(ProtocolError, match=says):
            parse(json.dumps({**hello, "resources": bad}), AGENT_MESSAGES)


def test_a_welcome_names_servers_by_address_and_port_only():
    welcome = {"v": 1, "type": "welcome", "node": "cpu-node-1", "stream": STREAM, "acked_seq": 0,
               "remote_servers": [{"node": "gpu-1", "address": "10.0.0.11:7470"},
                                  {"node": "gpu-2", "address": "[fd00::2]:7470"}]}
    assert len(parse(json.dumps(welcome), PORTAL_MESSAGES).remote_servers) == 2
    for address in ("10.0.0.11", "a b:7470", "host:port", "x" * 300 + ":1"):
        bad = {**welcome, "remote_servers": [{"node": "gpu-1", "address": address}]}
        with pytest.raises(ProtocolError, match="address"):
            parse(json.dumps(bad), PORTAL_MESSAGES)
