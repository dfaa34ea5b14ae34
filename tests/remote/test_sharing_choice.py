"""Adaptive sharing (scheduler/core/remote.py): exclusive, local or remote per request, from the request,
the team's permission, free capacity and the measured links."""

from __future__ import annotations

import pytest

from scheduler.core.model import Gpu, Node, Request, Share, Snapshot
from scheduler.core.remote import Link, RemotePolicy, SharingMode, choose_sharing, link_score

GIB = 1024


def gpu_node(name: str, cpu_free: int, used: float = 0.0) -> Node:
    shares = (Share("other", used, 8 * GIB),) if used else ()
    return Node(name, (Gpu(f"{name}-gpu0", 0, "A100", 80 * GIB, shares=shares),), cpu_milli_free=cpu_free,
                memory_mib_free=64 * GIB)


def cpu_node(name: str) -> Node:
    return Node(name, (), cpu_milli_free=64000, memory_mib_free=256 * GIB)


REQUEST = Request("r1", gpu_request=0.3, gpu_memory_mib=10 * GIB, cpu_milli=8000, memory_mib=16 * GIB)
ALLOWED = RemotePolicy(allowed=True)


def links(*items: tuple[str, str, float, float]) -> dict[tuple[str, str], Link]:
    return {(c, g): Link(c, g, rtt, bw) for c, g, rtt, bw in items}


def test_a_gpu_node_with_room_for_the_pod_is_local() -> None:
    snap = Snapshot((gpu_node("gpu-1", cpu_free=32000), cpu_node("cpu-1")))
    choice = choose_sharing(snap, REQUEST, links(("cpu-1", "gpu-1", 0.05, 25000)), ALLOWED)
    assert choice.mode == SharingMode.LOCAL
    assert choice.pod_node == choice.gpu_node == "gpu-1"
    assert "where the pod runs" in choice.reason


def test_a_whole_gpu_is_exclusive_and_never_remote() -> None:
    whole = Request("w", gpu_request=1.0, cpu_milli=8000)
    snap = Snapshot((gpu_node("gpu-1", cpu_free=32000), cpu_node("cpu-1")))
    assert choose_sharing(snap, whole, {}, ALLOWED).mode == SharingMode.EXCLUSIVE
    starved = Snapshot((gpu_node("gpu-1", cpu_free=1000), cpu_node("cpu-1")))
    choice = choose_sharing(starved, whole, links(("cpu-1", "gpu-1", 0.05, 25000)), ALLOWED)
    assert choice.mode is None
    assert "never remote" in choice.reason


def test_a_gpu_node_without_cpu_for_the_pod_goes_remote_when_allowed() -> None:
    snap = Snapshot((gpu_node("gpu-1", cpu_free=2000), cpu_node("cpu-1")))
    good = links(("cpu-1", "gpu-1", 0.08, 25000))
    refused = choose_sharing(snap, REQUEST, good, RemotePolicy(allowed=False))
    assert refused.mode is None
    assert "remote shares are not allowed" in refused.reason
    assert any(r.code == "node_cpu" for r in refused.reasons)
    choice = choose_sharing(snap, REQUEST, good, ALLOWED)
    assert choice.mode == SharingMode.REMOTE
    assert (choice.pod_node, choice.gpu_node, choice.gpu_uuid) == ("cpu-1", "gpu-1", "gpu-1-gpu0")
    assert "used remotely from cpu-1 over 25,000 Mbit/s, 0.08 ms" in choice.reason


def test_links_that_are_too_slow_or_unmeasured_are_not_used() -> None:
    snap = Snapshot((gpu_node("gpu-1", cpu_free=2000), cpu_node("cpu-1")))
    slow = choose_sharing(snap, REQUEST, links(("cpu-1", "gpu-1", 0.1, 400)), ALLOWED)
    assert slow.mode is None
    assert "below 1000 Mbit/s or above 2 ms" in slow.reason
    far = choose_sharing(snap, REQUEST, links(("cpu-1", "gpu-1", 9.0, 10000)), ALLOWED)
    assert far.mode is None
    unmeasured = choose_sharing(snap, REQUEST, {}, ALLOWED)
    assert unmeasured.mode is None
    assert "no measured link" in unmeasured.reason


def test_the_better_link_wins_between_client_nodes() -> None:
    snap = Snapshot((gpu_node("gpu-1", cpu_free=2000), cpu_node("cpu-1"), cpu_node("cpu-2")))
    table = links(("cpu-1", "gpu-1", 0.5, 10000), ("cpu-2", "gpu-1", 0.1, 25000))
    assert choose_sharing(snap, REQUEST, table, ALLOWED).pod_node == "cpu-2"


def test_the_link_decides_between_gpus_when_the_engine_has_no_strong_preference() -> None:
    snap = Snapshot((gpu_node("gpu-1", cpu_free=2000), gpu_node("gpu-2", cpu_free=2000), cpu_node("cpu-1")))
    near_2 = links(("cpu-1", "gpu-1", 1.5, 2000), ("cpu-1", "gpu-2", 0.05, 40000))
    assert choose_sharing(snap, REQUEST, near_2, ALLOWED).gpu_node == "gpu-2"
    near_1 = links(("cpu-1", "gpu-1", 0.05, 40000), ("cpu-1", "gpu-2", 1.5, 2000))
    assert choose_sharing(snap, REQUEST, near_1, ALLOWED).gpu_node == "gpu-1"


def test_a_full_gpu_is_not_a_remote_candidate() -> None:
    snap = Snapshot((gpu_node("gpu-1", cpu_free=2000, used=0.9), cpu_node("cpu-1")))
    choice = choose_sharing(snap, REQUEST, links(("cpu-1", "gpu-1", 0.05, 25000)), ALLOWED)
    assert choice.mode is None
    assert "no GPU has room for the share" in choice.reason


def test_link_score_and_policy_bounds() -> None:
    policy = RemotePolicy(allowed=True)
    assert link_score(Link("a", "b", 0.1, 25000), policy) == pytest.approx(1.0)
    assert link_score(Link("a", "b", 1.0, 2500), policy) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="link weight"):
        RemotePolicy(link_weight=2)
