"""The frame size limit counts UTF-8 bytes, not characters, however the parser measures it."""

from __future__ import annotations

import json

import pytest

from wire.agent_portal import AGENT_MESSAGES, MAX_MESSAGE_BYTES, ProtocolError, parse


def test_a_frame_under_the_limit_in_characters_but_over_it_in_bytes_is_too_large():
    pad = "€" * (MAX_MESSAGE_BYTES // 3 + 10)  # 3 bytes each: fewer characters than the limit, more bytes
    raw = '{"v":1,"type":"error","code":"internal","fatal":false,"message":"' + pad + '"}'
    assert len(raw) < MAX_MESSAGE_BYTES
    with pytest.raises(ProtocolError) as refused:
        parse(raw, AGENT_MESSAGES)
    size = len(raw.encode())
    assert (refused.value.code, str(refused.value)) == (
        "too_large", f"message is {size} bytes, the limit is {MAX_MESSAGE_BYTES}")


def test_a_frame_of_exactly_the_limit_is_parsed_not_refused_for_size():
    head = '{"v":1,"type":"error","code":"internal","fatal":false,"message":"'
    raw = head + "é" * ((MAX_MESSAGE_BYTES - len(head) - 2) // 2) + '"}'
    raw = raw[:-2] + "x" * (MAX_MESSAGE_BYTES - len(raw.encode())) + '"}'
    assert len(raw.encode()) == MAX_MESSAGE_BYTES
    with pytest.raises(ProtocolError) as refused:
        parse(raw, AGENT_MESSAGES)
    assert refused.value.code == "invalid_message"  # too long a message text, not too large a frame
    assert "message: String should have at most 1024 characters" in str(refused.value)


def test_duplicate_gpus_in_a_sample_are_refused_with_the_same_words():
    gpu = {"uuid": "GPU-1", "sm_util_pct": 1, "mem_util_pct": 1, "mem_used_mib": 1, "power_w": 1.0, "temp_c": 1}
    raw = json.dumps({"v": 1, "type": "samples", "stream": "3c66582e-e581-4e1d-aa74-80ea6746c195", "dropped": 0,
                      "samples": [{"seq": 1, "ts_ms": 1_800_000_000_000, "gpus": [gpu, gpu], "processes": [],
                                   "shares": []}]})
    with pytest.raises(ProtocolError) as refused:
        parse(raw, AGENT_MESSAGES)
    assert (refused.value.code, str(refused.value)) == (
        "invalid_message", "samples: samples[0]: gpus: duplicate uuid in one sample")
