"""Share tokens for remote GPU shares, issued with the placement when its pod is made.

The GPU node's remote server (preload/remote, run by deploy/agent/node-plugins.yaml) accepts a
client only with a token signed with that node's own secret (wire/share_tokens.py), and runs
its calls under the token's terms. The portal reads each node's secret from
TESSERA_REMOTE_SECRETS_DIR, one file per node name: the same Secret the node DaemonSet mounts,
whose keys are the node names (as for the agent tokens). A node without a secret cannot serve
remote shares: binding fails with what the operator must create.

A token lives as long as its reservation may last plus EXPIRY_SLACK_S (so that a pod outliving the
end by a few minutes while the portal releases it is not refused mid-way): to its end time, or, if
later, to the longest its team's policy lets a member extend it to (placed_at + max_duration_s),
since the token is fixed in the pod's environment and an extension cannot reach it. A reservation
without an end time gets TESSERA_REMOTE_TOKEN_TTL_S. The server checks a token's expiry at each
hello: a client process connected before it keeps its worker until it disconnects or the share is
revoked. Not covered: a site admin's extension beyond the team's maximum (new processes of the pod
are refused after the token's end).

A token names its placement (`attempt`, the reservation's attempt counter): when the share leaves
the node, the node's agent hears which attempts of it are void (`revoked_shares`,
portal/telemetry/services.py), so a share placed on the same node again is served with its new
token only.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings

from portal.fleet.links import server_address
from portal.reservations.models import Reservation
from portal.tenancy.policy import policy_of
from scheduler.backends import GpuShare, PermanentBackendError
from scheduler.backends.base import broker_priority, remote_share_env
from wire.share_tokens import ShareTerms, TokenError, issue


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


def token_ttl_s(expires_at: datetime | None, now: float | None = None, longest_end: datetime | None = None) -> int:
    """How long the token of a reservation ending at `expires_at` (and extensible by its members up to
    `longest_end`) lives from `now`: to the later of the two plus the slack (at least the slack), or
    TESSERA_REMOTE_TOKEN_TTL_S for a reservation without an end."""
    if expires_at is None:
        return settings.TESSERA_REMOTE_TOKEN_TTL_S
    end = max(expires_at, longest_end) if longest_end is not None else expires_at
    left = end.timestamp() - (time.time() if now is None else now)
    return max(0, int(left)) + EXPIRY_SLACK_S


def _longest_end(reservation_id: str) -> tuple[datetime | None, datetime | None]:
    """The reservation's end time, and the latest a member may extend it to under its team's policy."""
    row = Reservation.objects.filter(pk=reservation_id).select_related("team").only(
        "expires_at", "placed_at", "team").first()
    if row is None or row.expires_at is None:
        return None, None
    start = row.placed_at or row.expires_at
    return row.expires_at, start + timedelta(seconds=policy_of(row.team).max_duration_s)


def remote_env(reservation_id: str, attempt: int, gpu_node: str, address: str | None, gpu: GpuShare,
               priority: int) -> dict[str, str]:
    """The client pod's variables: the server on `gpu_node` and a token for exactly this share and
    this placement of it (`attempt`)."""
    terms = ShareTerms(share=reservation_id, gpu=gpu.uuid, memory_bytes=gpu.gpu_memory_mib << 20,
                       request=gpu.gpu_request, limit=max(gpu.gpu_limit, gpu.gpu_request),
                       priority=broker_priority(priority), attempt=attempt)
    expires_at, longest_end = _longest_end(reservation_id)
    now = time.time()
    try:
        token = issue(secret_for(gpu_node), terms, ttl_s=token_ttl_s(expires_at, now, longest_end), now=now)
    except TokenError as exc:
        raise PermanentBackendError(f"cannot issue the share token: {exc}") from None
    return remote_share_env(reservation_id, server_address(gpu_node, address), token)
