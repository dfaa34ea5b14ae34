"""The placement annotation is outside input to the device plugin: what the backend writes is
accepted as is, anything else is refused with the field named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.deviceplugin.placement import NodePaths, container_response
from scheduler.backends import GpuShare
from scheduler.backends.base import placement_annotation, share_env
from wire.pod_placement import PLACEMENT_ANNOTATION, PlacementError, parse_placement

UUID = "GPU-0a1b2c3d-0000-4000-8000-000000000001"


def annotated(**fields):
    base = {"reservation": "12", "gpus": [UUID], "request": 0.25, "limit": 0.5, "memory_mib": 8192, "priority": "low"}
    base.update(fields)
    return {PLACEMENT_ANNOTATION: json.dumps(base)}


@given(request=st.floats(0.01, 1.0), extra=st.floats(0.0, 1.0), memory=st.integers(1, 81920),
       priority=st.integers(0, 100), count=st.integers(1, 8), rid=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,20}",
                                                                              fullmatch=True))
def test_what_the_backend_writes_gives_the_same_env_as_a_pod_the_backend_creates(request, extra, memory, priority,
                                                                                count, rid):
    limit = min(1.0, request + extra)
    gpus = tuple(GpuShare(f"GPU-0a1b2c3d-0000-4000-8000-00000000000{i}", i, request, limit, memory)
                 for i in range(count))
    placement = parse_placement({PLACEMENT_ANNOTATION: placement_annotation(rid, gpus, priority)})
    # A kubectl pod (device plugin) and a portal pod (backend) get the very same share terms.
    assert dict(container_response(placement, NodePaths()).envs) == share_env(rid, gpus, priority)


@pytest.mark.parametrize(("fields", "complaint"), [
    ({"request": 0.0}, "request"),
    ({"request": 1.5}, "request"),
    ({"limit": 0.1}, "limit 0.1 is below request 0.25"),
    ({"gpus": []}, "gpus"),
    ({"gpus": [UUID, UUID]}, "the same GPU twice"),
    ({"gpus": ["not-a-gpu"]}, "gpus.0"),
    ({"memory_mib": "8192"}, "memory_mib"),
    ({"priority": "urgent"}, "priority"),
    ({"reservation": "12; rm -rf /"}, "reservation"),
    ({"shell": "x"}, "shell"),
])
def test_a_wrong_field_is_refused_by_name(fields, complaint):
    with pytest.raises(PlacementError, match=r"tessera\.io/placement") as refused:
        parse_placement(annotated(**fields))
    assert complaint in str(refused.value)


def test_no_annotation_or_no_json_is_refused_plainly():
    with pytest.raises(PlacementError, match=r"no tessera\.io/placement annotation"):
        parse_placement({})
    with pytest.raises(PlacementError, match="not JSON"):
        parse_placement({PLACEMENT_ANNOTATION: "{"})
    with pytest.raises(PlacementError, match="longer than"):
        parse_placement({PLACEMENT_ANNOTATION: " " * 5000})
