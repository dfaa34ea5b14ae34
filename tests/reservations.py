"""Reservations in a given state for tests, made the way users and the cycle make them: through
portal.reservations.services, the only writer of reservation and allocation rows. A reservation
that must look older is made with the clock moved (`clock_at`), never by writing its timestamps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from unittest import mock

SYSTEM = "system:test"


@contextmanager
def clock_at(when: datetime) -> Iterator[None]:
    """Inside the block it is `when` for Django (`django.utils.timezone.now`): for the services and
    for the ORM's auto_now fields alike, as if the work happened then."""
    with mock.patch("django.utils.timezone.now", return_value=when):
        yield


def submitted(user, team, *, image: str = "busybox:1.36", **spec):
    """A pending reservation of `user` in `team`; `spec` as `ReservationSpec`'s fields
    (gpu_request, gpu_memory_mib, priority, kind, max_duration_s, ...)."""
    from portal.reservations import rules, services

    return services.submit(user, rules.ReservationSpec(team=team, image=image, **spec))


def placed(reservation, gpu, share: Decimal | str | None = None, memory_mib: int | None = None,
           admission: str = "guaranteed"):
    """`reservation` placed on `gpu` (with its own share and memory unless given, admitted as
    `admission`), as the cycle commits it; the row as it is now."""
    from portal.reservations import services
    from portal.reservations.models import Reservation

    share = Decimal(share) if share is not None else reservation.gpu_request
    memory = memory_mib if memory_mib is not None else reservation.gpu_memory_mib
    services.place(reservation.pk, gpu.node_id, [services.NewAllocation(gpu.pk, share, memory)],
                   admission=admission)
    return Reservation.objects.get(pk=reservation.pk)


def running(reservation, gpu, share: Decimal | str | None = None, memory_mib: int | None = None,
            admission: str = "guaranteed"):
    """`reservation` placed on `gpu` and its pod reported running."""
    from portal.reservations import services
    from portal.reservations.models import Reservation
    from portal.reservations.states import State

    placed(reservation, gpu, share, memory_mib, admission)
    assert services.move(reservation.pk, State.PLACED, State.RUNNING, "its pod runs", SYSTEM)
    return Reservation.objects.get(pk=reservation.pk)


def ended(reservation, outcome: str = "succeeded", why: str = "its pod ended"):
    """A reservation that held GPUs ends with `outcome` and gives them back."""
    from portal.reservations import services
    from portal.reservations.models import Reservation

    assert services.release(reservation.pk, outcome, why, SYSTEM)
    return Reservation.objects.get(pk=reservation.pk)
