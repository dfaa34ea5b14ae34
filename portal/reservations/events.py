"""Signals about reservations other apps listen to, each sent only after the transaction that
changed things has committed. (Asking for a placement cycle is portal/cycle_requests.py.)"""

import threading
from contextlib import contextmanager

from django.db import transaction
from django.dispatch import Signal

# A reservation that named a pod stopped holding its GPUs: its pod is to be deleted on the cluster.
pod_ended = Signal()  # kwargs: reservation_id (int)
# What is allocated on some nodes changed (placed, released); telemetry pushes each node's
# placements to its agent. Sent after commit, once per commit with every node it touched.
allocations_changed = Signal()  # kwargs: node_ids (sorted list of int)
# Reservations whose state, reason or place in the queue changed; telemetry tells the browsers
# that watch them (ws/live). Sent after commit, once per commit: {reservation id: team id}.
reservations_changed = Signal()  # kwargs: changes (dict[int, int])
# The node under a reservation was lost (it was requeued or failed): its owner is told why.
node_lost = Signal()  # kwargs: reservation_id (int), why (str)
# A site admin forced a planned drain over these bookings: their owners are told what it takes.
booking_drained = Signal()  # kwargs: reservation_ids (list of int), plan_id (int), why (str)


# The notifications below run after the change has committed, and are best effort: the periodic
# cycle, sync and reconcile catch up on any that fail. `robust`: a failing one (Redis away) is
# logged, and neither stops the others nor turns the committed change into an error answer,
# which a client would retry and so duplicate.
def request_pod_cleanup(reservation_id: int) -> None:
    transaction.on_commit(lambda: pod_ended.send(sender=None, reservation_id=reservation_id), robust=True)


def announce_node_lost(reservation_id: int, why: str) -> None:
    """Sent after commit, before the reservation's own change is announced (noted first)."""
    transaction.on_commit(lambda: node_lost.send(sender=None, reservation_id=reservation_id, why=why), robust=True)


def announce_bookings_drained(reservation_ids: list[int], plan_id: int, why: str) -> None:
    transaction.on_commit(lambda: booking_drained.send(sender=None, reservation_ids=reservation_ids,
                                                       plan_id=plan_id, why=why), robust=True)


_pending = threading.local()


def announce_allocations(node_id: int | None) -> None:
    """Tell the node's agent after commit. A commit that changes many shares on one node sends
    one push for that node, not one per share: the first callback to run flushes every node
    noted so far, the rest find nothing left (a push carries the node's full list, so an extra
    one after a rolled-back savepoint is harmless)."""
    if node_id is None:
        return
    held = getattr(_pending, "held", None)
    if held is not None:  # inside announcements_held(): one push per node when it ends
        held.add(node_id)
        return
    nodes = getattr(_pending, "nodes", None)
    if nodes is None:
        nodes = _pending.nodes = set()
    nodes.add(node_id)
    transaction.on_commit(_flush_allocations, robust=True)


@contextmanager
def announcements_held():
    """Hold the pushes of many commits (a placement cycle's batches) and send one per node at the
    end, even if a commit inside failed (a push carries the node's full list: an extra one is
    harmless). Agents hear up to the length of the block later; the cycle saves a channel-layer
    round per node per batch."""
    if getattr(_pending, "held", None) is not None:  # nested: the outer block sends
        yield
        return
    _pending.held = set()
    try:
        yield
    finally:
        held, _pending.held = _pending.held, None
        if held:
            allocations_changed.send(sender=None, node_ids=sorted(held))


def _flush_allocations() -> None:
    nodes = getattr(_pending, "nodes", None)
    if not nodes:
        return
    _pending.nodes = set()
    allocations_changed.send(sender=None, node_ids=sorted(nodes))


def announce_reservations(changes: dict[int, int]) -> None:
    """Tell the browsers watching these reservations (id → team id) after commit; a commit that
    changes many (a placement batch) sends one signal with all of them."""
    if not changes:
        return
    noted = getattr(_pending, "reservations", None)
    if noted is None:
        noted = _pending.reservations = {}
    noted.update(changes)
    transaction.on_commit(_flush_reservations, robust=True)


def _flush_reservations() -> None:
    noted = getattr(_pending, "reservations", None)
    if not noted:
        return
    _pending.reservations = {}
    reservations_changed.send(sender=None, changes=noted)


def forget_pending() -> None:
    """Drop what this thread noted for announcing: a transaction rolled back without running its
    on_commit callbacks (every test's) leaves its notes behind."""
    _pending.nodes = set()
    _pending.reservations = {}
