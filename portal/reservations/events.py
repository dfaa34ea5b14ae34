"""Signals other apps listen to. The placement app connects `cycle_requested` to enqueue a
placement cycle; it is sent only after the transaction that changed things has committed."""

from django.db import transaction
from django.dispatch import Signal

cycle_requested = Signal()  # kwargs: reason (str)
# What is allocated on a node changed (placed, released); telemetry pushes the node's placements
# to its agent. Sent after commit.
allocations_changed = Signal()  # kwargs: node_id (int)


def request_cycle(reason: str) -> None:
    transaction.on_commit(lambda: cycle_requested.send(sender=None, reason=reason))


def announce_allocations(node_id: int | None) -> None:
    if node_id is not None:
        transaction.on_commit(lambda: allocations_changed.send(sender=None, node_id=node_id))
