"""Asking for a placement cycle: every writer whose change may alter what fits (a reservation
submitted or ended, a node or GPU changed, quotas or the department tree changed) calls
`request_cycle`; the placement app hears `cycle_requested` and enqueues the cycle. It sits below
the apps that ask (reservations, tenancy, fleet) and the one that answers (placement), so none of
them imports another to ask."""

from django.db import transaction
from django.dispatch import Signal

cycle_requested = Signal()  # kwargs: reason (str), freed (bool: capacity or quota may have been freed)


def request_cycle(reason: str, freed: bool = False) -> None:
    """Sent after the transaction commits, best effort (`robust`: the periodic cycle catches up
    when the broker is away). `freed`: the change may let waiting reservations in that did not fit
    before (quotas or the quota tree changed), so the next cycle looks at all of them again."""
    transaction.on_commit(lambda: cycle_requested.send(sender=None, reason=reason, freed=freed), robust=True)
