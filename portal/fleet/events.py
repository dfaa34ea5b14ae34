"""Signals of the fleet app: `nodes_changed` after a commit that changed what the fleet view shows
of some nodes (status, a GPU cordoned). Telemetry tells the site admins' browsers (ws/live/
`fleet` group); allocation changes reach them through reservations' `allocations_changed`.
`node_token_retired` after a commit that replaced or revoked a node's agent token: telemetry
closes the connections that authenticated with it."""

from __future__ import annotations

from django.db import transaction
from django.dispatch import Signal

nodes_changed = Signal()  # kwargs: node_ids (sorted list of int)
node_token_retired = Signal()  # kwargs: node_id (int), token_hash (str, the retired token's hash)


def announce_nodes(node_ids: list[int]) -> None:
    """Send `nodes_changed` after commit (best effort, like reservations.events: the page
    re-reads every row on screen when its socket comes back)."""
    ids = sorted(set(node_ids))
    if ids:
        transaction.on_commit(lambda: nodes_changed.send(sender=None, node_ids=ids), robust=True)


def announce_token_retired(node_id: int, token_hash: str) -> None:
    """Send `node_token_retired` after commit (nothing when the node had no token)."""
    if token_hash:
        transaction.on_commit(
            lambda: node_token_retired.send(sender=None, node_id=node_id, token_hash=token_hash), robust=True)
