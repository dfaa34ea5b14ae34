"""Share tokens for remote GPU shares, issued with the placement when its pod is made.

The GPU node's remote server (preload/remote, run by deploy/agent/node-plugins.yaml) accepts a
client only with a token signed with that node's own secret (agents/remote/tokens.py), and runs
its calls under the token's terms. The portal reads each node's secret from
TESSERA_REMOTE_SECRETS_DIR, one file per node name: the same Secret the node DaemonSet mounts,
whose keys are the node names (as for the agent tokens). A node without a secret cannot serve
remote shares: binding fails with what the operator must create.

A token lives as long as its reservation (expires_at) plus EXPIRY_SLACK_S, so that a pod outliving
the end by a few minutes while the portal releases it is not refused mid-way; a reservation without
an end time gets TESSERA_REMOTE_TOKEN_TTL_S. The server checks a token's expiry at each hello: a
client process connected before it keeps its worker until it disconnects or the share is revoked.
The token is fixed in the pod's environment, so an extension does not reach it: the pod's processes
that connect after the original end (plus slack) are refused.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from django.conf import settings

from agents.remote.tokens import ShareTerms, TokenError, issue
from portal.fleet.links import server_address
from portal.reservations.models import Reservation
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


EXPIRY_SLACK_S = 600  # a token outlives its reservation's end by this much (the release is not instant)


def token_ttl_s(expires_at: datetime | None, now: float | None = None) -> int:
    """How long the token of a reservation ending at `expires_at` lives from `now`: to the end plus
    the slack (at least the slack), or TESSERA_REMOTE_TOKEN_TTL_S for a reservation without an end."""
    if expires_at is None:
        return settings.TESSERA_REMOTE_TOKEN_TTL_S
    left = expires_at.timestamp() - (time.time() if now is None else now)
    return max(0, int(left)) + EXPIRY_SLACK_S


def remote_env(reservation_id: str, gpu_node: str, address: str | None, gpu: GpuShare,
               priority: int) -> dict[str, str]:
    """The client pod's variables: the server on `gpu_node` and a token for exactly this share."""
    terms = ShareTerms(share=reservation_id, gpu=gpu.uuid, memory_bytes=gpu.gpu_memory_mib << 20,
                       request=gpu.gpu_request, limit=max(gpu.gpu_limit, gpu.gpu_request),
                       priority=broker_priority(priority))
    expires_at = Reservation.objects.filter(pk=reservation_id).values_list("expires_at", flat=True).first()
    now = time.time()
    try:
        token = issue(secret_for(gpu_node), terms, ttl_s=token_ttl_s(expires_at, now), now=now)
    except TokenError as exc:
        raise PermanentBackendError(f"cannot issue the share token: {exc}") from None
    return remote_share_env(reservation_id, server_address(gpu_node, address), token)
