import logging

from django.apps import AppConfig

log = logging.getLogger(__name__)


def _enqueue_cycle(sender, reason: str = "", **kwargs) -> None:
    from .tasks import request_cycle

    try:
        request_cycle(reason)
    except Exception:  # the broker is away: the periodic cycle will place it
        log.exception("could not enqueue a placement cycle (%s)", reason)


def _reconcile_on_start(sender=None, **kwargs) -> None:
    from .tasks import reconcile

    reconcile.delay()


class PlacementConfig(AppConfig):
    name = "portal.placement"
    label = "placement"

    def ready(self) -> None:
        from celery.signals import worker_ready

        from portal.reservations.events import cycle_requested

        cycle_requested.connect(_enqueue_cycle, dispatch_uid="placement-cycle-on-request")
        worker_ready.connect(_reconcile_on_start, dispatch_uid="placement-reconcile-on-start", weak=False)
