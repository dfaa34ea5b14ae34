"""The `kubernetes` backend: pods for reservations, the KubeShare-label (kubectl) path, and the pod
and node watch, through the official client.

- `backend.KubernetesBackend`: the `scheduler.backends.base.Backend` contract
- `manifests`: the pod, binding and event manifests we send, and the values we read back
- `api`: timeouts, retries with backoff, and HTTP answers turned into backend errors
- `watch`: pod and node watches turned into `ClusterEvent`s (coalesced per object between polls)
- `terminal`: a shell in a pod through the exec subresource (`open_terminal`)
- `webhook`: the mutating admission webhook that gives KubeShare pods their `tessera.io/gpu-share`
  slot, so the device plugin (`agents/deviceplugin`) is asked for them

Tests: `tests/scheduler/backends/` (a fake API server speaking the client's HTTP, faults included;
every manifest sent is validated with kubernetes-validate).
"""

from .api import RetryPolicy
from .backend import KubernetesBackend

__all__ = ["KubernetesBackend", "RetryPolicy"]
