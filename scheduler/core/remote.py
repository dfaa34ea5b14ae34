"""Adaptive sharing (KubeGPU): for one request, an exclusive GPU, a share of a GPU on the node the pod
runs on (local), or a share of a GPU on another node reached over the network (remote, through
preload/remote), chosen from the request, whether remote is allowed (a request field and a team
policy), free capacity and the measured links; remote candidates are scored by the link from the
node the pod would run on to the GPU's node.

Pure (no I/O): a snapshot, a request and a link table in, a `SharingChoice` with its reason in words
out. The engine's own placement (`feasible_gpus`) decides which GPU; this module only adds the
remote alternative when the local one fails, so with remote not allowed it changes nothing.

    choose_sharing(snapshot, request, links, RemotePolicy(allowed=True)) -> SharingChoice
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from .cycle import feasible_gpus
from .model import GpuCandidate, Node, NodeStatus, Reason, ReasonCode, Request, Snapshot


class SharingMode(StrEnum):
    EXCLUSIVE = "exclusive"
    LOCAL = "local"
    REMOTE = "remote"


@dataclass(frozen=True)
class Link:
    """A measured link from the node a pod runs on to a GPU node (agents/remote/probe.py)."""

    client_node: str
    gpu_node: str
    rtt_ms: float
    bandwidth_mbps: float


@dataclass(frozen=True)
class RemotePolicy:
    allowed: bool = False  # the request asks for it and its team's policy permits it
    min_bandwidth_mbps: float = 1000.0  # links below this never carry a remote share
    max_rtt_ms: float = 2.0
    link_weight: float = 0.5  # how much the link counts against the GPU's own score
    ref_bandwidth_mbps: float = 25000.0  # a link this fast (or faster) scores full marks for bandwidth
    ref_rtt_ms: float = 0.1  # a round trip this short (or shorter) scores full marks for latency

    def __post_init__(self) -> None:
        if self.min_bandwidth_mbps < 0 or self.max_rtt_ms <= 0 or not 0 <= self.link_weight <= 1:
            raise ValueError("remote policy: bandwidth >= 0, rtt > 0, link weight in [0, 1]")
        if self.ref_bandwidth_mbps <= 0 or self.ref_rtt_ms <= 0:
            raise ValueError("remote policy: reference bandwidth and rtt must be positive")


@dataclass(frozen=True)
class SharingChoice:
    request_id: str
    mode: SharingMode | None  # None: nowhere now (see reasons)
    pod_node: str | None = None  # where the pod runs
    gpu_node: str | None = None  # where its GPU is (= pod_node unless remote)
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    score: float = 0.0
    reason: str = ""
    link: Link | None = None
    reasons: tuple[Reason, ...] = ()


def link_score(link: Link, policy: RemotePolicy) -> float:
    """In (0, 1]: half bandwidth (against the reference), half latency (reference / rtt)."""
    bandwidth = min(1.0, link.bandwidth_mbps / policy.ref_bandwidth_mbps)
    latency = min(1.0, policy.ref_rtt_ms / max(link.rtt_ms, 1e-6))
    return 0.5 * bandwidth + 0.5 * latency


def _usable(link: Link | None, policy: RemotePolicy) -> bool:
    return link is not None and link.bandwidth_mbps >= policy.min_bandwidth_mbps and link.rtt_ms <= policy.max_rtt_ms


def _room_for_pod(node: Node, request: Request) -> bool:
    if node.status != NodeStatus.READY:
        return False
    if node.cpu_milli_free is not None and node.cpu_milli_free < request.cpu_milli:
        return False
    return node.memory_mib_free is None or node.memory_mib_free >= request.memory_mib


def _local(request: Request, best: GpuCandidate, mode: SharingMode) -> SharingChoice:
    what = "a whole GPU" if mode == SharingMode.EXCLUSIVE else f"a {request.gpu_request:g} share"
    return SharingChoice(request.id, mode, best.node, best.node, best.gpu_uuid, best.gpu_index, best.score,
                         f"{what} of GPU {best.gpu_index} on {best.node}, where the pod runs")


def choose_sharing(
    snapshot: Snapshot,
    request: Request,
    links: Mapping[tuple[str, str], Link],
    policy: RemotePolicy,
    scheduler_policy: str = "tessera",
) -> SharingChoice:
    """Exclusive for whole GPUs; local when a GPU node has room for the share and the pod; else, if
    allowed, remote: a GPU with room for the share, on another node than a node with room for the pod,
    joined by a measured link that meets the policy, best by GPU score and link score together."""
    local, reasons = feasible_gpus(snapshot, request, scheduler_policy)
    whole = request.gpu_request >= 1.0
    if local:
        return _local(request, local[0], SharingMode.EXCLUSIVE if whole else SharingMode.LOCAL)
    if whole or request.gpu_count != 1:
        return SharingChoice(request.id, None, reasons=tuple(reasons),
                             reason="whole GPUs are never remote: no node has them free now")
    if not policy.allowed:
        return SharingChoice(request.id, None, reasons=tuple(reasons),
                             reason="no node has room for the share and the pod; remote shares are not allowed "
                                    "for this request")
    # the GPU side of a remote share takes GPU time and memory only: the pod's CPU and memory are elsewhere
    gpus, _ = feasible_gpus(snapshot, replace(request, cpu_milli=0, memory_mib=0), scheduler_policy)
    pods = [node for node in snapshot.nodes if _room_for_pod(node, request)]
    best: tuple[float, GpuCandidate, Node, Link] | None = None
    measured = unusable = 0
    for rank, gpu in enumerate(gpus):
        gpu_score = 1.0 - rank / len(gpus)  # the engine's order, on a scale links can be weighed against
        for pod in pods:
            if pod.name == gpu.node:
                continue
            link = links.get((pod.name, gpu.node))
            if link is None:
                continue
            measured += 1
            if not _usable(link, policy):
                unusable += 1
                continue
            score = (1 - policy.link_weight) * gpu_score + policy.link_weight * link_score(link, policy)
            if best is None or score > best[0]:
                best = (score, gpu, pod, link)
    if best is None:
        if not gpus:
            why = "no GPU has room for the share"
        elif not pods:
            why = "no node has CPU and memory free for the pod"
        elif not measured:
            why = "no measured link joins a node with room for the pod to a GPU with room"
        else:
            why = (f"{unusable} measured link(s) to GPUs with room are below {policy.min_bandwidth_mbps:g} Mbit/s "
                   f"or above {policy.max_rtt_ms:g} ms")
        return SharingChoice(request.id, None, reasons=(*reasons, Reason(ReasonCode.NO_FIT, f"remote: {why}")),
                             reason=f"no local room; {why}")
    score, gpu, pod, link = best
    return SharingChoice(
        request.id, SharingMode.REMOTE, pod.name, gpu.node, gpu.gpu_uuid, gpu.gpu_index, score,
        f"no GPU node has room for the pod itself; a {request.gpu_request:g} share of GPU {gpu.gpu_index} on "
        f"{gpu.node}, used remotely from {pod.name} over {link.bandwidth_mbps:,.0f} Mbit/s, {link.rtt_ms:g} ms",
        link,
    )
