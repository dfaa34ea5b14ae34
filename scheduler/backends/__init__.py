"""Cluster backends: carry placement decisions out on a cluster, with plain data in and out.

`base` holds the contract (`Backend` protocol, `PodSpec`, `PodStatus`, events, errors; read its
docstring). `create(name, **options)` builds one by name:

- ``"local"``: `local.LocalBackend(nodes=..., state_path=...)`: simulated pods for the quickstart
  and tests (state in a SQLite file so that web, worker and beat processes share one cluster).
- ``"kubernetes"``: `kubernetes.KubernetesBackend(**options)` (the official client); imported only
  when asked for, so the quickstart never needs a cluster.
"""

from __future__ import annotations

from typing import Any

from .base import (
    Backend,
    BackendError,
    ClusterEvent,
    ExternalBinding,
    ExternalPod,
    GpuShare,
    NodeCondition,
    NodeEvent,
    PermanentBackendError,
    Phase,
    PodConflict,
    PodEvent,
    PodRef,
    PodSpec,
    PodStatus,
    TransientBackendError,
    make_pod_spec,
    pod_name,
)

NAMES = ("local", "kubernetes")


def create(name: str, **options: Any) -> Backend:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(**options)
    if name == "kubernetes":
        from .kubernetes import KubernetesBackend

        return KubernetesBackend(**options)
    raise ValueError(f"backend: unknown backend {name!r}; known: {', '.join(NAMES)}")


__all__ = [
    "NAMES",
    "Backend",
    "BackendError",
    "ClusterEvent",
    "ExternalBinding",
    "ExternalPod",
    "GpuShare",
    "NodeCondition",
    "NodeEvent",
    "PermanentBackendError",
    "Phase",
    "PodConflict",
    "PodEvent",
    "PodRef",
    "PodSpec",
    "PodStatus",
    "TransientBackendError",
    "create",
    "make_pod_spec",
    "pod_name",
]
