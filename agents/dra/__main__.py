"""Command line: ``python -m agents.dra --node NODE`` on every GPU node of a cluster with DRA (the
DaemonSet in deploy/dra/daemonset.yaml), or with ``--simulate INVENTORY`` for a node from an
inventory file. Publishes the node's ResourceSlice and serves the kubelet DRA plugin."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from kubernetes.config import ConfigException

from agents.deviceplugin.__main__ import gpu_source

from .cdi import CDI_DIR
from .plugin import PLUGINS_DIR, REGISTRY_DIR, DraService, KubernetesClaims, PluginRunner
from .slices import SliceApi, SlicePublisher

log = logging.getLogger("agents.dra")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agents.dra",
                                description="Tessera's DRA driver gpu.tessera.io: the node's GPUs as a "
                                            "ResourceSlice, and the kubelet plugin that prepares claims.")
    p.add_argument("--node", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                   help="this node's name in Kubernetes (default: $NODE_NAME, else the host name)")
    p.add_argument("--plugins-dir", type=Path, default=Path(PLUGINS_DIR),
                   help="where the DRA service's socket goes (under the kubelet's plugins directory)")
    p.add_argument("--registry-dir", type=Path, default=Path(REGISTRY_DIR),
                   help="the kubelet's plugins_registry directory (its plugin watcher looks there)")
    p.add_argument("--cdi-dir", type=Path, default=Path(CDI_DIR), help="where the container runtime reads CDI specs")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where the checkpoint of prepared claims is kept (default: --plugins-dir)")
    p.add_argument("--simulate", metavar="INVENTORY", type=Path,
                   help="publish the GPUs of a node from an inventory YAML instead of NVML")
    p.add_argument("--api-server", help="API server URL (default: the pod's service account, in-cluster)")
    p.add_argument("--resync", type=float, default=30.0, help="seconds between ResourceSlice checks")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    source = gpu_source(args, parser)
    try:
        slices, claims = SliceApi(host=args.api_server), KubernetesClaims(host=args.api_server)
    except ConfigException as exc:
        parser.error(f"cannot reach the API server ({exc}): run in a pod with a service account, "
                     "or pass --api-server")
    service = DraService(args.node, source.devices(), claims, state_dir=args.state_dir or args.plugins_dir,
                         cdi_dir=args.cdi_dir)
    runner = PluginRunner(service, plugins_dir=args.plugins_dir, registry_dir=args.registry_dir)
    publisher = SlicePublisher(slices, args.node)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runner.start()

    def read():
        # A GPU that stops answering leaves the slice (the next generation) until it answers again; a
        # failed read of them all says nothing about any one GPU, so the slice stays as it is.
        gpus = source.devices()
        try:
            seen = {r.uuid for r in source.read().gpus}
            gpus = [g for g in gpus if g.uuid in seen]
        except Exception as exc:  # NVML raises its own error types; any of them means "cannot read"
            log.warning("GPU read failed: %s", exc)
        return gpus, source.driver_version(), source.cuda_version()

    threading.Thread(target=publisher.run, args=(read, stop, args.resync), daemon=True).start()
    log.info("driver gpu.tessera.io on node %s: %d GPU(s)", args.node, len(source.devices()))
    runner.run()
    source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
