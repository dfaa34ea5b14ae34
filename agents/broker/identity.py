"""Whose process is on the other end of a broker connection: read from what the process cannot forge.

The kernel records the peer's pid when it connects (SO_PEERCRED); the process's cgroup, which the
kubelet names for the pod (agents/cgroup.py), or its session says whose it is. A process may join a
share only if that matches what the node agent said of the share (``ShareTerms``): its pod UID on
Kubernetes, the sessions the agent started it in where pods are local processes.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Protocol

from agents.broker.protocol import ShareTerms
from agents.cgroup import CgroupResolver

_UCRED = struct.Struct("3i")  # pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket, as the kernel saw it at connect.
    The pid is 0 when that process is in a PID namespace the broker does not see."""
    pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


class PeerIdentity(Protocol):
    name: str

    def refusal(self, pid: int, terms: ShareTerms) -> str | None:
        """Why process ``pid`` may not join the share, or None if it may."""


def _unseen(pid: int) -> str | None:
    if pid <= 0:
        return "the process is in a PID namespace the broker cannot see (run it in the host's: hostPID)"
    return None


class CgroupIdentity:
    """Kubernetes: the pod whose cgroup the process is in must be the share's pod. With
    ``trust_own_pod``, processes of the broker's own pod (the remote server's workers, each started
    for a client whose share token the server verified) may join any share the agent named."""

    name = "cgroup"

    def __init__(self, proc_root: str | Path = "/proc", trust_own_pod: bool = False) -> None:
        self.resolver = CgroupResolver(proc_root)
        own = self.resolver.resolve(os.getpid()) if trust_own_pod else None
        if trust_own_pod and own is None:
            raise ValueError("--trust-own-pod: the broker is not in a pod (no kubepods cgroup)")
        self.own_pod = own.pod_uid if own is not None else None

    def refusal(self, pid: int, terms: ShareTerms) -> str | None:
        if reason := _unseen(pid):
            return reason
        ref = self.resolver.resolve(pid)
        if ref is None:
            return f"pid {pid} is in no pod"
        if self.own_pod is not None and ref.pod_uid == self.own_pod:
            return None
        if terms.pod_uid is None:
            return f"share {terms.share} has no pod on this node yet"
        if ref.pod_uid != terms.pod_uid:
            return f"pid {pid} is in pod {ref.pod_uid}, not share {terms.share}'s"
        return None


class SessionIdentity:
    """Local pods (plain processes, no pod cgroups): the process's session must be one the agent
    registered for the share, the session it started the pod's process in."""

    name = "session"

    def refusal(self, pid: int, terms: ShareTerms) -> str | None:
        if reason := _unseen(pid):
            return reason
        try:
            session = os.getsid(pid)
        except OSError:
            return f"pid {pid} is gone"
        if session not in terms.sessions:
            return f"pid {pid} (session {session}) is not in share {terms.share}'s sessions"
        return None
