"""The `kubernetes` backend: pods for reservations, the KubeShare-label (kubectl) path, and the pod
and node watch, through the official client.

- `backend.KubernetesBackend`: the `scheduler.backends.base.Backend` contract
- `manifests`: the pod, binding and event manifests we send, and the values we read back
- `api`: timeouts, retries with backoff, and HTTP answers turned into backend errors
- `watch`: pod and node watches turned into `ClusterEvent`s
"""

from .api import RetryPolicy
from .backend import KubernetesBackend

__all__ = ["KubernetesBackend", "RetryPolicy"]
