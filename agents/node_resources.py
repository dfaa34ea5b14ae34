"""What this node offers pods: its CPUs and memory less what the operator keeps for the system,
as the `resources` of the agent's hello (wire/PROTOCOL.md 4.1).

The agent does not talk to the Kubernetes API, so it cannot read the node's `status.allocatable`;
it measures the host (the CPUs online, `MemTotal` of the host's /proc/meminfo, which a container
sees unchanged) and subtracts `--reserved-cpu` and `--reserved-memory`: set them to the kubelet's
kube-reserved + system-reserved (+ the memory eviction threshold) for the numbers the kubelet
calls allocatable.
"""

from __future__ import annotations

import os
from pathlib import Path

from wire.agent_portal import MAX_NODE_CPU_MILLI, MAX_NODE_MEMORY_MIB


class ResourcesError(ValueError):
    """The host's CPU or memory could not be read, or nothing is left after the reservation."""


def host_memory_mib(proc_root: Path) -> int:
    path = proc_root / "meminfo"
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            if line.startswith("MemTotal:"):
                value, unit = line.split()[1:3]
                if unit != "kB":
                    break
                return int(value) // 1024
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ResourcesError(f"cannot read {path}: {exc}") from None
    raise ResourcesError(f"{path} has no MemTotal in kB")


def allocatable(proc_root: Path, reserved_cpu_milli: int = 0, reserved_memory_mib: int = 0,
                cpus: int | None = None) -> dict[str, int]:
    """{"cpu_milli", "memory_mib"} this node offers pods, within the protocol's bounds."""
    cpus = cpus if cpus is not None else os.cpu_count()
    if not cpus:
        raise ResourcesError("the number of CPUs is unknown")
    cpu_milli = cpus * 1000 - reserved_cpu_milli
    memory_mib = host_memory_mib(proc_root) - reserved_memory_mib
    if cpu_milli < 1 or memory_mib < 1:
        raise ResourcesError(f"nothing left for pods: {cpus} CPUs less {reserved_cpu_milli}m reserved, "
                             f"{memory_mib + reserved_memory_mib} MiB less {reserved_memory_mib} MiB reserved")
    return {"cpu_milli": min(cpu_milli, MAX_NODE_CPU_MILLI), "memory_mib": min(memory_mib, MAX_NODE_MEMORY_MIB)}
