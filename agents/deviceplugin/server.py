"""The gRPC side: the DevicePlugin service the kubelet calls, registration with the kubelet, and
re-registration when the kubelet restarts (it wipes the device-plugin directory, our socket too)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agents.gpus.base import GpuDevice
from wire.pod_placement import PlacementError, parse_placement

from . import api_pb2, api_pb2_grpc
from .devices import DEFAULT_SLOTS_PER_GPU, share_devices
from .placement import NodePaths, container_response
from .pods import NoPodForAllocation, PodFinder

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
RESOURCE_NAME = "tessera.io/gpu-share"


@dataclass
class PluginConfig:
    node: str
    gpus: Sequence[GpuDevice]
    plugin_dir: str = DEVICE_PLUGIN_DIR
    resource_name: str = RESOURCE_NAME
    endpoint: str = "tessera-gpu-share.sock"
    slots_per_gpu: int = DEFAULT_SLOTS_PER_GPU
    paths: NodePaths = field(default_factory=NodePaths)
    pass_device_specs: bool = False  # answer the GPUs' /dev nodes too (no NVIDIA runtime on the node)


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, cfg: PluginConfig, finder: PodFinder) -> None:
        self.cfg = cfg
        self.finder = finder
        self._gpu_uuids = frozenset(g.uuid for g in cfg.gpus)
        # NVML's index: the device node's minor number on the usual node (nvmlDeviceGetMinorNumber is exact).
        self._minor = {g.uuid: g.index for g in cfg.gpus}
        self._unhealthy: frozenset[str] = frozenset()
        self._changed = threading.Condition()
        self._generation = 0
        self._stopped = False
        share_devices(cfg.gpus, cfg.slots_per_gpu)  # fail at start on a bad slot count

    # -- health, from whoever watches the GPUs ------------------------------------------------------

    def set_unhealthy(self, uuids: frozenset[str]) -> None:
        with self._changed:
            if uuids != self._unhealthy:
                self._unhealthy = frozenset(uuids)
                self._generation += 1
                self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    # -- the kubelet's calls ------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request, context) -> Iterator[api_pb2.ListAndWatchResponse]:
        generation = -1
        while True:
            with self._changed:
                while generation == self._generation and not self._stopped and context.is_active():
                    self._changed.wait(1.0)
                if self._stopped or not context.is_active():
                    return
                generation = self._generation
                unhealthy = self._unhealthy
            yield api_pb2.ListAndWatchResponse(
                devices=share_devices(self.cfg.gpus, self.cfg.slots_per_gpu, unhealthy))

    def GetPreferredAllocation(self, request, context):
        # Not advertised (options say so); any slots will do, the placement annotation decides.
        return api_pb2.PreferredAllocationResponse(container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(r.available_deviceIDs)[: r.allocation_size])
            for r in request.container_requests])

    def Allocate(self, request, context):
        responses = []
        for creq in request.container_requests:
            try:
                claim = self.finder.claim(len(creq.devices_ids))
                placement = parse_placement(dict(claim.annotations))
            except (NoPodForAllocation, PlacementError) as exc:
                log.warning("allocate %s: %s", list(creq.devices_ids), exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            foreign = [g for g in placement.gpus if g not in self._gpu_uuids]
            if foreign:
                msg = (f"pod {claim.namespace}/{claim.name} is placed on GPU {', '.join(foreign)}, "
                       f"which node {self.cfg.node} does not have")
                log.warning("allocate: %s", msg)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, msg)
            log.info("allocate: pod %s/%s container %s gets %s (reservation %s)", claim.namespace, claim.name,
                     claim.container, ",".join(placement.gpus), placement.reservation)
            minors = [self._minor[g] for g in placement.gpus] if self.cfg.pass_device_specs else None
            responses.append(container_response(placement, self.cfg.paths, minors))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request, context):
        return api_pb2.PreStartContainerResponse()


def register(cfg: PluginConfig, timeout_s: float = 5.0) -> None:
    """Tell the kubelet where we serve which resource. Raises grpc.RpcError if it refuses."""
    target = f"unix://{Path(cfg.plugin_dir) / KUBELET_SOCKET}"
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        api_pb2_grpc.RegistrationStub(channel).Register(api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=cfg.endpoint, resource_name=cfg.resource_name,
            options=api_pb2.DevicePluginOptions(pre_start_required=False,
                                                get_preferred_allocation_available=False)),
            timeout=timeout_s)


class PluginRunner:
    """Serves the plugin on its socket and keeps it registered: when the socket disappears (the
    kubelet restarted and cleaned its directory) it serves again and registers again."""

    def __init__(self, service: DevicePluginService, check_every_s: float = 1.0) -> None:
        self.service = service
        self.cfg = service.cfg
        self.check_every_s = check_every_s
        self.registrations = 0
        self._server: grpc.Server | None = None
        self._stop = threading.Event()

    @property
    def socket_path(self) -> Path:
        return Path(self.cfg.plugin_dir) / self.cfg.endpoint

    def _serve(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0)
        path = self.socket_path
        if path.exists():
            path.unlink()
        # One thread per open ListAndWatch stream plus the unary calls.
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="tessera-dp"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._server = server

    def start(self) -> None:
        """Serve and register once; raises when the kubelet cannot be reached."""
        self._serve()
        register(self.cfg)
        self.registrations += 1
        log.info("registered %s at %s with the kubelet", self.cfg.resource_name, self.socket_path)

    def run(self) -> None:
        """Keep serving until `stop()`; re-serve and re-register whenever the socket is gone."""
        while not self._stop.wait(self.check_every_s):
            if not os.path.exists(self.socket_path):
                log.info("plugin socket gone (kubelet restart?); serving and registering again")
                try:
                    self.start()
                except (grpc.RpcError, grpc.FutureTimeoutError, OSError) as exc:
                    log.warning("registration failed (%s); trying again", exc)
                    if self._server is not None and self.socket_path.exists():
                        self.socket_path.unlink()  # so the next check tries again

    def stop(self) -> None:
        self._stop.set()
        self.service.stop()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
