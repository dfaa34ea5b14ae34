"""Which pod and container a process belongs to, read from /proc/<pid>/cgroup.

The kubelet puts each pod in a cgroup named for the pod UID and each container in one named for the
container ID. The naming depends on the cgroup driver and runtime, e.g.

    cgroup v1, cgroupfs:  11:memory:/kubepods/burstable/pod<uid>/<container id>
    cgroup v2, systemd:   0::/kubepods.slice/kubepods-burstable.slice/
                              kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope
    containerd, systemd:  0::/system.slice/containerd.service/
                              kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>

so we look for the `pod<uid>` segment (dashes or underscores) and the 64-hex container ID after it.
The agent must run in the host PID namespace (hostPID) to see the workload's processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_POD = re.compile(
    r"pod([0-9a-f]{8})[-_]([0-9a-f]{4})[-_]([0-9a-f]{4})[-_]([0-9a-f]{4})[-_]([0-9a-f]{12})(?![0-9a-f])"
)
_CONTAINER = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


@dataclass(frozen=True)
class PodRef:
    pod_uid: str
    container_id: str | None


def parse_cgroup(text: str) -> PodRef | None:
    """The pod (and container) named in the text of a /proc/<pid>/cgroup file; None if not a pod."""
    for line in text.splitlines():
        # hierarchy-ID:controller-list:cgroup-path; the path itself may contain ':'.
        parts = line.split(":", 2)
        if len(parts) != 3 or "kubepods" not in parts[2]:
            continue
        path = parts[2]
        pod = _POD.search(path)
        if pod is None:
            continue
        container = _CONTAINER.search(path, pod.end())
        return PodRef(pod_uid="-".join(pod.groups()), container_id=container.group(1) if container else None)
    return None


class CgroupResolver:
    """Looks processes up under a proc root (the host's /proc, or a fixture directory in tests)."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.proc_root = Path(proc_root)

    def resolve(self, pid: int) -> PodRef | None:
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
        except OSError:
            # Gone already, or not visible from here (agent not in the host PID namespace).
            return None
        return parse_cgroup(text)
