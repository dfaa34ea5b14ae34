"""Signals other apps listen to. The placement app connects `cycle_requested` to enqueue a
placement cycle; it is sent only after the transaction that changed things has committed."""

from django.db import transaction
from django.dispatch import Signal

cycle_requested = Signal()  # kwargs: reason (str)


def request_cycle(reason: str) -> None:
    transaction.on_commit(lambda: cycle_requested.send(sender=None, reason=reason))
