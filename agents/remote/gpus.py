"""The GPUs a node's remote server serves, written down before it starts.

    python -m agents.remote.gpus OUT

Writes the node's GPU UUIDs to OUT, one a line, as NVML discovers them: the same UUIDs the node's agent
reports to the portal, so the same the portal signs into share tokens. The node DaemonSet runs it as
an init container (deploy/agent/node-plugins.yaml) and the server reads the file (``--gpu-file``): a
token for any other GPU is refused, and each client's worker sees only its token's GPU. Exits non-zero
(the pod does not start) when NVML cannot be used or sees no GPU: a server with no GPU to serve is a
broken node, not an idle one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agents.gpus.base import GpuSource
from agents.remote.files import write_whole


class NoGpusError(RuntimeError):
    """Nothing for the server to serve; the message says why."""


def gpu_uuids(source: GpuSource) -> list[str]:
    uuids = [d.uuid for d in source.devices()]
    if not uuids:
        raise NoGpusError("NVML sees no GPU on this node: is the NVIDIA runtime giving this container the devices "
                          "(runtimeClassName: nvidia, NVIDIA_VISIBLE_DEVICES=all)?")
    return uuids


def write_gpu_file(path: Path, uuids: list[str]) -> None:
    write_whole(path, "".join(f"{u}\n" for u in uuids))


def main(argv: list[str] | None = None, source: GpuSource | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.remote.gpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the file the remote server reads with --gpu-file")
    args = parser.parse_args(argv)
    try:
        if source is None:
            from agents.gpus.nvml import NvmlSource

            source = NvmlSource()
        uuids = gpu_uuids(source)
    except (RuntimeError, OSError) as exc:  # GpuSourceError, NoGpusError
        print(f"tessera-remote-gpus: {exc}", file=sys.stderr)
        return 1
    write_gpu_file(args.out, uuids)
    print(f"tessera-remote-gpus: {len(uuids)} GPU(s) for the remote server: {' '.join(uuids)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
