"""Command line: `tessera-agent` / `python -m agents`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import socket
import sys
from pathlib import Path

from pydantic import ValidationError

from agents import __version__
from agents.agent import DEFAULT_BUFFER_SECONDS, Agent, AgentSettings
from agents.cgroup import CgroupResolver
from agents.gpus.base import GpuSource
from agents.gpus.none import NoGpuSource
from agents.node_resources import ResourcesError, allocatable
from agents.placements import PlacementTable
from agents.remote.probe import LinkTable
from agents.remote.revocations import RevokedFile
from agents.share_usage import BrokerUsage
from agents.signals import stop_on_signals
from agents.stream import websocket_url
from wire.agent_portal import NODE_NAME_PATTERN, TOKEN_PATTERN
from wire.inventory import InventoryError, load_inventory, pick_node

log = logging.getLogger("agents")

TOKEN_ENV = "TESSERA_AGENT_TOKEN"
MIN_BUFFER_SECONDS = 600.0  # the agent promises at least ten minutes of samples across an outage

DESCRIPTION = """\
Tessera node agent: samples this node's GPUs about once a second and streams the samples to the
portal over a WebSocket (protocol: wire/PROTOCOL.md). While the portal is unreachable it keeps
sampling into a bounded buffer and replays it in order after reconnecting."""

EPILOG = f"""\
The node token (made with `manage.py node_token NODE`) comes from --token, --token-file or the
{TOKEN_ENV} environment variable; prefer the file or the variable, since command lines are visible
to every user of the machine.

examples:
  tessera-agent --portal https://tessera.example.org --token-file /etc/tessera/token
  python -m agents --portal http://127.0.0.1:8000 --token T \
      --simulate deploy/inventory/demo.yaml --node t4-node-1
  tessera-agent --portal https://tessera.example.org --token-file /etc/tessera/token --no-gpus \
      --remote-server gpu-node-1=10.0.0.11:7470
"""


def _bounded(kind: type, low: float, high: float):  # type: ignore[no-untyped-def]
    """An argparse type: a number of `kind` (int or float) in [low, high], refused in words."""
    what = "a whole number" if kind is int else "a number"

    def parse(text: str):  # type: ignore[no-untyped-def]
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not low <= value <= high:
            show = str if kind is int else "{:g}".format
            raise argparse.ArgumentTypeError(f"{show(value)} is out of range ({show(low)} to {show(high)})")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera-agent",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--portal", required=True, metavar="URL",
                        help="portal address, e.g. https://tessera.example.org (the agent connects to "
                             "wss://.../ws/agents/); a ws:// or wss:// URL is used as given")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", metavar="TOKEN", help="this node's token")
    token.add_argument("--token-file", metavar="PATH", type=Path, help="read the node token from a file")
    parser.add_argument("--node", metavar="NAME",
                        help="node name (default: $NODE_NAME, else the host name); with --simulate, "
                             "which inventory node to simulate")
    parser.add_argument("--simulate", metavar="INVENTORY", type=Path,
                        help="simulate the GPUs of a node from an inventory YAML instead of using NVML")
    parser.add_argument("--no-gpus", action="store_true",
                        help="a node without GPUs: no NVML; report the node, its CPU and memory and the links "
                             "to the GPU nodes' servers, for the remote GPU shares its pods may use")
    parser.add_argument("--reserved-cpu", metavar="MILLICORES", type=_bounded(int, 0, 1_000_000), default=0,
                        help="CPU kept for the system, not offered to pods (default 0; set the kubelet's "
                             "kube-reserved + system-reserved)")
    parser.add_argument("--reserved-memory", metavar="MIB", type=_bounded(int, 0, 16_777_216), default=100,
                        help="memory kept for the system, in MiB (default 100, the kubelet's eviction threshold; "
                             "add its kube-reserved + system-reserved)")
    parser.add_argument("--interval", metavar="SECONDS", type=_bounded(float, 0.1, 60.0), default=1.0,
                        help="seconds between samples (default 1)")
    parser.add_argument("--buffer-seconds", metavar="SECONDS",
                        type=_bounded(float, MIN_BUFFER_SECONDS, 86_400.0), default=DEFAULT_BUFFER_SECONDS,
                        help=f"how much sampling the local buffer holds while the portal is unreachable "
                             f"(default {DEFAULT_BUFFER_SECONDS:g}, at least {MIN_BUFFER_SECONDS:g})")
    parser.add_argument("--backoff-max", metavar="SECONDS", type=_bounded(float, 1.0, 600.0), default=30.0,
                        help="longest wait between reconnection attempts (default 30)")
    parser.add_argument("--proc-root", metavar="PATH", type=Path, default=Path("/proc"),
                        help="where to read processes' cgroups to find their pods, and the node's meminfo "
                             "(default /proc)")
    parser.add_argument("--broker-socket", metavar="PATH", type=Path,
                        help="the node's share broker's control socket: the agent gives it every share's "
                             "terms and reads the GPU time each share used")
    parser.add_argument("--remote-server", metavar="NODE=HOST:PORT", action="append", default=[],
                        help="a GPU node's remote-share server to probe and report the link to (repeatable; "
                             "besides these, the agent probes the GPU nodes the portal names)")
    parser.add_argument("--revoked-file", metavar="PATH", type=Path,
                        default=Path(os.environ["TESSERA_REVOKED_FILE"]) if os.environ.get("TESSERA_REVOKED_FILE")
                        else None,
                        help="write the remote shares that left this GPU node and the placement attempts of "
                             "theirs whose tokens are void, for the remote server's --revoked-file "
                             "(env TESSERA_REVOKED_FILE)")
    parser.add_argument("--probe-interval", metavar="SECONDS", type=_bounded(float, 1.0, 86_400.0), default=600.0,
                        help="how often each link to a GPU node is measured again (default 600; a probe moves "
                             "at most 16 MiB)")
    parser.add_argument("--seed", type=int, help="random seed of the simulated GPUs (with --simulate)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _read_token(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    if args.token is not None:
        token, origin = args.token, "--token"
    elif args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"--token-file {args.token_file}: cannot read: {exc}")
        origin = f"--token-file {args.token_file}"
    elif os.environ.get(TOKEN_ENV):
        token, origin = os.environ[TOKEN_ENV].strip(), TOKEN_ENV
    else:
        parser.error(f"no node token: give --token, --token-file or set {TOKEN_ENV}")
    if not re.fullmatch(TOKEN_PATTERN, token):
        parser.error(f"{origin}: a node token is 1 to 512 printable characters without spaces")
    return token


def _node_name(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    node_name = args.node or os.environ.get("NODE_NAME") or socket.gethostname().lower()
    if not re.fullmatch(NODE_NAME_PATTERN, node_name):
        parser.error(f"node name {node_name!r} is not a Kubernetes node name; pass --node")
    return node_name


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        url = websocket_url(args.portal)
    except ValueError as exc:
        parser.error(f"--portal {exc}")
    token = _read_token(parser, args)
    if args.seed is not None and args.simulate is None:
        parser.error("--seed only applies with --simulate")
    if args.broker_socket is not None and args.simulate is not None:
        parser.error("--broker-socket does not apply with --simulate (simulated shares report their own use)")
    if args.no_gpus and (args.simulate is not None or args.broker_socket is not None):
        parser.error("--no-gpus is a node without GPUs: it takes neither --simulate nor --broker-socket")

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )

    source: GpuSource
    resolver: CgroupResolver | None = None
    share_usage: BrokerUsage | None = None
    resources: dict[str, int] | None = None
    if args.simulate is None:
        try:  # the inventory says a simulated node's CPU and memory; a real one measures its own
            resources = allocatable(args.proc_root, args.reserved_cpu, args.reserved_memory)
        except ResourcesError as exc:
            parser.error(f"this node's CPU and memory: {exc}")
    if args.no_gpus:
        node_name = _node_name(parser, args)
        placements = PlacementTable(set())
        source = NoGpuSource()
    elif args.simulate is not None:
        from agents.gpus.simulated import SimulatedSource

        try:
            node = pick_node(load_inventory(args.simulate), args.node, str(args.simulate))
        except InventoryError as exc:
            parser.error(f"--simulate {exc}")
        node_name = node.name
        placements = PlacementTable({g.uuid for g in node.gpus})
        source = SimulatedSource(node, placements, seed=args.seed)
    else:
        from agents.gpus.nvml import GpuSourceError, NvmlSource

        node_name = _node_name(parser, args)
        try:
            source = NvmlSource()
        except GpuSourceError as exc:
            print(f"tessera-agent: {exc}", file=sys.stderr)
            return 1
        placements = PlacementTable({d.uuid for d in source.devices()})
        resolver = CgroupResolver(args.proc_root)
        if args.broker_socket is not None:
            share_usage = BrokerUsage(args.broker_socket, {d.uuid for d in source.devices()},
                                      placements=placements)

    servers: dict[str, str] = {}
    for item in args.remote_server:
        gpu_node, _, address = item.partition("=")
        host, _, port = address.rpartition(":")
        if not re.fullmatch(NODE_NAME_PATTERN, gpu_node) or not host or not port.isdigit() or gpu_node in servers:
            parser.error(f"--remote-server {item!r}: give NODE=HOST:PORT, each GPU node once")
        servers[gpu_node] = address
    settings = AgentSettings(
        url=url,
        token=token,
        node=node_name,
        interval_s=args.interval,
        buffer_seconds=args.buffer_seconds,
        backoff_cap_s=args.backoff_max,
    )
    try:
        agent = Agent(settings, source, placements, resolver, share_usage,
                      # a real node probes the servers given here and those the portal names
                      links=LinkTable(servers, interval_s=args.probe_interval)
                      if servers or args.simulate is None else None,
                      resources=resources,
                      revoked=RevokedFile(args.revoked_file) if args.revoked_file is not None else None)
    except (ValueError, ValidationError) as exc:
        # e.g. more GPUs than the protocol carries, or a GPU name NVML reports oddly
        print(f"tessera-agent: this node cannot be described in protocol v1: {exc}", file=sys.stderr)
        return 1
    log.info("tessera-agent %s: node %s, %d GPUs (%s), portal %s",
             __version__, node_name, len(agent.hello.gpus), source.kind, url)
    asyncio.run(_run(agent))
    return 0


async def _run(agent: Agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    stop_on_signals(loop, stop.set)
    await agent.run(stop)
    log.info("stopped; %d samples were still unacknowledged", len(agent.buffer))


if __name__ == "__main__":
    sys.exit(main())
