"""Share tokens for remote GPU shares, issued with the placement when its pod is made.

The GPU node's remote server (preload/remote, run by deploy/agent/node-plugins.yaml) accepts a
client only with a token signed with that node's own secret (agents/remote/tokens.py), and runs
its calls under the token's terms. The portal reads each node's secret from
TESSERA_REMOTE_SECRETS_DIR, one file per node name: the same Secret the node DaemonSet mounts,
whose keys are the node names (as for the agent tokens). A node without a secret cannot serve
remote shares: binding fails with what the operator must create.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from agents.remote.tokens import ShareTerms, TokenError, issue
from portal.fleet.links import server_address
from scheduler.backends import GpuShare, PermanentBackendError
from scheduler.backends.base import broker_priority, remote_share_env


def secret_for(node: str) -> bytes:
    where = settings.TESSERA_REMOTE_SECRETS_DIR
    if not where:
        raise PermanentBackendError("remote shares need TESSERA_REMOTE_SECRETS_DIR (one secret file per GPU node)")
    path = Path(where) / node
    if "/" in node or not path.is_file():
        raise PermanentBackendError(f"no remote-share secret for node {node} in {where}: add the key {node} "
                                    "to the tessera-remote-secrets Secret")
    secret = path.read_bytes().rstrip(b"\n")
    if len(secret) < 16:
        raise PermanentBackendError(f"the remote-share secret of node {node} is shorter than 16 bytes")
    return secret


def remote_env(reservation_id: str, gpu_node: str, address: str | None, gpu: GpuShare,
               priority: int) -> dict[str, str]:
    """The client pod's variables: the server on `gpu_node` and a token for exactly this share."""
    terms = ShareTerms(share=reservation_id, gpu=gpu.uuid, memory_bytes=gpu.gpu_memory_mib << 20,
                       request=gpu.gpu_request, limit=max(gpu.gpu_limit, gpu.gpu_request),
                       priority=broker_priority(priority))
    try:
        token = issue(secret_for(gpu_node), terms, ttl_s=settings.TESSERA_REMOTE_TOKEN_TTL_S)
    except TokenError as exc:
        raise PermanentBackendError(f"cannot issue the share token: {exc}") from None
    return remote_share_env(reservation_id, server_address(gpu_node, address), token)
