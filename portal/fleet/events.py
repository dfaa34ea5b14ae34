"""Signals of the fleet app: `nodes_changed` after a commit that changed what the fleet view shows
of some nodes (status, a GPU cordoned). Telemetry tells the site admins' browsers (ws/live/
`fleet` group); allocation changes reach them through reservations' `allocations_changed`."""

from __future__ import annotations

from django.db import transaction
from django.dispatch import Signal

nodes_changed = Signal()  # kwargs: node_ids (sorted list of int)


def announce_nodes(node_ids: list[int]) -> None:
    """Send `nodes_changed` after commit (best effort, like reservations.events: the page
    re-reads every row on screen when its socket comes back)."""
    ids = sorted(set(node_ids))
    if ids:
        transaction.on_commit(lambda: nodes_changed.send(sender=None, node_ids=ids), robust=True)
