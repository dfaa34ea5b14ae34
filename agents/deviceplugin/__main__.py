"""Command line: ``python -m agents.deviceplugin --node NODE`` on every GPU node (the DaemonSet in
deploy/agent/node-plugins.yaml), or with ``--simulate INVENTORY`` for a node from an inventory file."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import grpc
from kubernetes.config import ConfigException

from agents.gpus.base import GpuSource

from .devices import DEFAULT_SLOTS_PER_GPU, MAX_SLOTS_PER_GPU
from .placement import NodePaths
from .pods import KubernetesPods, PodFinder
from .server import DEVICE_PLUGIN_DIR, RESOURCE_NAME, DevicePluginService, PluginConfig, PluginRunner

log = logging.getLogger("agents.deviceplugin")


def _slots(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_SLOTS_PER_GPU:
        raise argparse.ArgumentTypeError(f"must be within 1..{MAX_SLOTS_PER_GPU}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agents.deviceplugin",
                                description="Tessera's kubelet device plugin: GPU shares for kubectl pods.")
    p.add_argument("--node", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                   help="this node's name in Kubernetes (default: $NODE_NAME, else the host name)")
    p.add_argument("--plugin-dir", type=Path, default=Path(DEVICE_PLUGIN_DIR),
                   help="the kubelet's device-plugin directory (holds kubelet.sock)")
    p.add_argument("--resource-name", default=RESOURCE_NAME, help="the extended resource pods ask for")
    p.add_argument("--slots-per-gpu", type=_slots, default=DEFAULT_SLOTS_PER_GPU,
                   help="share slots advertised per GPU: the most pods one GPU can hold")
    p.add_argument("--simulate", metavar="INVENTORY", type=Path,
                   help="advertise the GPUs of a node from an inventory YAML instead of NVML")
    p.add_argument("--api-server", help="API server URL (default: the pod's service account, in-cluster)")
    p.add_argument("--preload-dir", default=NodePaths.preload_dir,
                   help="node directory holding libtessera_preload.so (mounted at the same path)")
    p.add_argument("--broker-dir", default=NodePaths.broker_dir,
                   help="node directory holding the share broker's socket (mounted at the same path)")
    p.add_argument("--pass-device-specs", action="store_true",
                   help="also give containers the GPUs' /dev/nvidia* nodes (for nodes without the NVIDIA "
                        "container runtime, which otherwise adds them from NVIDIA_VISIBLE_DEVICES)")
    p.add_argument("--health-interval", type=float, default=10.0, help="seconds between GPU health checks")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def gpu_source(args: argparse.Namespace, parser: argparse.ArgumentParser) -> GpuSource:
    if args.simulate is not None:
        from agents.gpus.simulated import SimulatedSource
        from agents.placements import PlacementTable
        from wire.inventory import InventoryError, load_inventory, pick_node

        try:
            node = pick_node(load_inventory(args.simulate), args.node, str(args.simulate))
        except InventoryError as exc:
            parser.error(f"--simulate {exc}")
        return SimulatedSource(node, PlacementTable({g.uuid for g in node.gpus}))
    from agents.gpus.nvml import GpuSourceError, NvmlSource

    try:
        return NvmlSource()
    except GpuSourceError as exc:
        parser.error(str(exc))
    raise AssertionError("unreachable")


def watch_health(source: GpuSource, service: DevicePluginService, every_s: float, stop: threading.Event) -> None:
    """A GPU that stops answering is advertised Unhealthy, so the kubelet admits no new pod on it."""
    known = {g.uuid for g in source.devices()}
    while not stop.wait(every_s):
        try:
            seen = {r.uuid for r in source.read().gpus}
        except Exception as exc:  # NVML raises its own error types; any of them means "cannot read"
            log.warning("GPU health check failed: %s", exc)
            seen = set()
        service.set_unhealthy(frozenset(known - seen))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    source = gpu_source(args, parser)
    cfg = PluginConfig(node=args.node, gpus=source.devices(), plugin_dir=str(args.plugin_dir),
                       resource_name=args.resource_name, slots_per_gpu=args.slots_per_gpu,
                       paths=NodePaths(preload_dir=args.preload_dir, broker_dir=args.broker_dir),
                       pass_device_specs=args.pass_device_specs)
    try:
        pods = KubernetesPods(host=args.api_server)
    except ConfigException as exc:
        parser.error(f"cannot reach the API server ({exc}): run in a pod with a service account, "
                     "or pass --api-server")
    service = DevicePluginService(cfg, PodFinder(pods, args.node, args.resource_name))
    runner = PluginRunner(service)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        runner.start()
    except (grpc.RpcError, grpc.FutureTimeoutError, OSError) as exc:
        log.error("cannot register with the kubelet at %s: %s", args.plugin_dir, exc)
        runner.stop()
        return 1
    threading.Thread(target=watch_health, args=(source, service, args.health_interval, stop), daemon=True).start()
    log.info("serving %d GPU(s) x %d slots as %s on node %s", len(cfg.gpus), cfg.slots_per_gpu,
             cfg.resource_name, cfg.node)
    runner.run()
    source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
