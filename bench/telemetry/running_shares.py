"""Running half-GPU shares on the first GPUs of a node, for the telemetry benchmarks: what agents'
share readings must name to be stored. Written straight to the tables (a benchmark's fixture, not
a reservation's life; the portal writes them only through its services)."""

from __future__ import annotations

from decimal import Decimal


def hold_shares(owner, team, node, shares: int) -> None:
    from portal.fleet.models import Gpu
    from portal.reservations.models import Allocation, Reservation
    from portal.reservations.states import State

    half = Decimal("0.5")
    for gpu in Gpu.objects.filter(node=node, index__lt=shares):
        r = Reservation.objects.create(owner=owner, team=team, image="bench", gpu_request=half, gpu_limit=half,
                                       gpu_memory_mib=1024, state=State.RUNNING, node=node)
        Allocation.objects.create(reservation=r, gpu=gpu, gpu_request=half, gpu_limit=half, gpu_memory_mib=1024)
