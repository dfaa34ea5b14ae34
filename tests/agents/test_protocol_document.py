"""wire/PROTOCOL.md is what the portal is built from: its limits and examples must match the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wire import agent_portal as protocol
from wire.inventory import simulated_gpu_uuid

DOC = (Path(__file__).resolve().parents[2] / "wire" / "PROTOCOL.md").read_text(encoding="utf-8")


def test_every_limit_in_the_document_matches_the_code():
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([0-9.]+) \|", DOC, flags=re.MULTILINE)
    assert len(rows) >= 20
    for name, value in rows:
        assert getattr(protocol, name) == float(value), f"PROTOCOL.md says {name} = {value}"


def test_every_error_code_is_documented():
    for code in protocol.ERROR_CODES:
        assert f"`{code}`" in DOC


def _example_frames() -> list[str]:
    block = DOC.split("## 9. Example frames", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    return ["".join(line.strip() for line in chunk.splitlines()) for chunk in block.strip().split("\n\n")]


@pytest.mark.parametrize("frame", _example_frames())
def test_example_frames_are_valid_messages(frame):
    kind = re.search(r'"type":"(\w+)"', frame).group(1)
    from_portal = kind in ("welcome", "ack", "placements")
    allowed = protocol.PORTAL_MESSAGES if from_portal else protocol.AGENT_MESSAGES
    assert protocol.parse(frame, allowed).type == kind


def test_the_documented_simulated_uuid_is_what_the_code_derives():
    assert "GPU-b8b674f7-7dab-5524-9c15-778f3c6902fd" in DOC
    assert simulated_gpu_uuid("a100-node-1", 0) == "GPU-b8b674f7-7dab-5524-9c15-778f3c6902fd"


def test_documented_patterns_are_the_code_patterns():
    for pattern in (protocol.NODE_NAME_PATTERN, protocol.STREAM_PATTERN, protocol.RESERVATION_PATTERN,
                    protocol.CONTAINER_ID_PATTERN, protocol.VERSION_PATTERN, protocol.TOKEN_PATTERN):
        assert f"`{pattern}`" in DOC, pattern
    assert "`^(GPU\\|MIG)-[A-Za-z0-9/-]{1,92}$`" in DOC  # escaped for the markdown table
