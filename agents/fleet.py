"""Many simulated agents in one process: `python -m agents.fleet` (quickstart and benchmarks).

Each node still gets its own Agent, WebSocket, token, buffer and sequence numbers, exactly as a
separate `tessera-agent --simulate` process would; they only share an event loop, so a laptop or a
2-core benchmark machine can run hundreds of nodes.

The tokens file is YAML (or JSON) mapping node names to their tokens:

    a100-node-1: 9f3c...   # from `manage.py node_token a100-node-1`
    t4-node-1: 41ab...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import random
import re
import sys
from pathlib import Path

import yaml

from agents import __version__
from agents.agent import Agent, AgentSettings
from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from agents.signals import stop_on_signals
from agents.stream import websocket_url
from wire.agent_portal import TOKEN_PATTERN
from wire.inventory import InventoryError, load_inventory

log = logging.getLogger("agents.fleet")


def read_tokens(path: Path) -> dict[str, str]:
    """node name -> token; raises ValueError naming the file and the entry at fault."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: must map node names to tokens")
    tokens = {}
    for node, token in data.items():
        if not isinstance(token, str) or not re.fullmatch(TOKEN_PATTERN, token):
            raise ValueError(f"{path}: {node}: a node token is 1 to 512 printable characters without spaces")
        tokens[str(node)] = token
    return tokens


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agents.fleet",
        description="Run one simulated tessera agent per inventory node, all in this process.",
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--portal", required=True, metavar="URL", help="portal address, as for tessera-agent")
    parser.add_argument("--simulate", required=True, metavar="INVENTORY", type=Path, help="inventory YAML")
    parser.add_argument("--tokens", required=True, metavar="FILE", type=Path,
                        help="YAML mapping each node name to its token")
    parser.add_argument("--nodes", metavar="N1,N2",
                        help="only these nodes (default: every node with a token)")
    parser.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between samples (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; node i uses seed+i")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def build_agents(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[Agent]:
    try:
        url = websocket_url(args.portal)
    except ValueError as exc:
        parser.error(f"--portal {exc}")
    if not 0.1 <= args.interval <= 60:
        parser.error("--interval must be between 0.1 and 60 seconds")
    try:
        nodes = {n.name: n for n in load_inventory(args.simulate)}
        tokens = read_tokens(args.tokens)
    except (InventoryError, ValueError) as exc:
        parser.error(str(exc))
    stray = sorted(set(tokens) - set(nodes))
    if stray:
        parser.error(f"{args.tokens}: node {stray[0]!r} is not in {args.simulate}")
    wanted = args.nodes.split(",") if args.nodes else sorted(tokens)
    for name in wanted:
        if name not in nodes:
            parser.error(f"--nodes: {name!r} is not in {args.simulate}")
        if name not in tokens:
            parser.error(f"--nodes: {args.tokens} has no token for {name!r}")
    agents = []
    for i, name in enumerate(wanted):
        node = nodes[name]
        table = PlacementTable({g.uuid for g in node.gpus})
        settings = AgentSettings(url=url, token=tokens[name], node=name, interval_s=args.interval)
        agent = Agent(settings, SimulatedSource(node, table, seed=args.seed + i), table)
        # Each reconnect reads the node's token from the file again: a token rotated in the portal
        # (which the demo writes there) is picked up without restarting the fleet.
        agent.stream.token_source = functools.partial(token_in, args.tokens, name)
        agents.append(agent)
    return agents


def token_in(path: Path, node: str) -> str | None:
    """The node's token in the tokens file now; None when the file cannot be read (keep the old one)."""
    try:
        return read_tokens(path).get(node)
    except ValueError:
        return None


async def run_fleet(agents: list[Agent], seed: int = 0) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    stop_on_signals(loop, stop.set)
    rng = random.Random(seed)

    async def staggered(agent: Agent) -> None:
        # Real nodes do not sample in lock-step; spreading the start over one interval keeps a
        # simulated fleet from hitting the portal with every node's sample in the same millisecond.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0, agent.settings.interval_s))
        await agent.run(stop)

    await asyncio.gather(*(staggered(agent) for agent in agents))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    agents = build_agents(args, parser)
    gpus = sum(len(a.hello.gpus) for a in agents)
    print(f"fleet: {len(agents)} simulated nodes, {gpus} GPUs -> {agents[0].settings.url}", file=sys.stderr)
    asyncio.run(run_fleet(agents, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
