"""Command line: ``python -m agents.broker --socket /run/tessera/broker.sock
--control-socket /run/tessera-broker/control.sock``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path

from agents.broker.identity import CgroupIdentity, PeerIdentity, SessionIdentity
from agents.broker.policy import BrokerSettings
from agents.broker.server import Broker, serve
from agents.signals import stop_on_signals


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    defaults = BrokerSettings()
    parser = argparse.ArgumentParser(
        prog="python -m agents.broker",
        description="Tessera share broker: grants GPU time tokens to the preload library "
        "(protocol: preload/PROTOCOL.md).",
    )
    parser.add_argument("--socket", required=True,
                        help="Unix socket path (TESSERA_BROKER_SOCKET of the workloads)")
    parser.add_argument("--control-socket", required=True,
                        help="the node agent's Unix socket (terms of every share, telemetry); in a "
                             "directory no workload mounts")
    parser.add_argument("--agent-uid", type=int, action="append", default=[],
                        help="a user the node agent runs as, besides root and the broker's own (repeatable)")
    parser.add_argument("--identity", choices=["cgroup", "session"], default="cgroup",
                        help="how a process is tied to its share: its pod's cgroup (Kubernetes; the broker "
                             "must see the host's PIDs) or its session (local pods, registered by the agent)")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"),
                        help="where to read processes' cgroups (default /proc)")
    parser.add_argument("--trust-own-pod", action="store_true",
                        help="with --identity cgroup: processes of the broker's own pod (the remote server's "
                             "workers) may join any share the agent named")
    parser.add_argument("--window", type=_positive, default=defaults.window_s, help="sliding window, seconds")
    parser.add_argument("--min-quota-ms", type=_positive, default=defaults.min_quota_s * 1e3)
    parser.add_argument("--max-quota-ms", type=_positive, default=defaults.max_quota_s * 1e3)
    parser.add_argument("--low-quota-ms", type=_positive, default=defaults.low_quota_s * 1e3,
                        help="quantum of low-priority shares while a high-priority share is on the GPU")
    parser.add_argument("--max-drain-ms", type=_positive, default=defaults.drain_max_s * 1e3,
                        help="how long a holder waiting for its queued kernels keeps the token past its quantum")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = BrokerSettings(
            window_s=args.window,
            min_quota_s=args.min_quota_ms / 1e3,
            max_quota_s=args.max_quota_ms / 1e3,
            initial_quota_s=min(max(BrokerSettings.initial_quota_s, args.min_quota_ms / 1e3),
                                args.max_quota_ms / 1e3),
            low_quota_s=args.low_quota_ms / 1e3,
            start_window_s=min(BrokerSettings.start_window_s, args.window),
            drain_max_s=args.max_drain_ms / 1e3,
        )
        identity: PeerIdentity = (CgroupIdentity(args.proc_root, args.trust_own_pod) if args.identity == "cgroup"
                                  else SessionIdentity())
    except ValueError as exc:
        print(f"python -m agents.broker: {exc}", file=sys.stderr)
        return 2
    if args.trust_own_pod and args.identity != "cgroup":
        print("python -m agents.broker: --trust-own-pod needs --identity cgroup", file=sys.stderr)
        return 2
    asyncio.run(_run_until_signalled(args, settings, identity))
    return 0


async def _run_until_signalled(args: argparse.Namespace, settings: BrokerSettings, identity: PeerIdentity) -> None:
    # SIGTERM (kubelet, systemd) and SIGINT end the broker cleanly: the socket file goes too
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    stop_on_signals(loop, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await serve(args.socket, broker=Broker(settings, identity),
                    control_path=args.control_socket, agent_uids=args.agent_uid)


if __name__ == "__main__":
    sys.exit(main())
