import logging

from django.apps import AppConfig

log = logging.getLogger(__name__)


def _on_cycle_requested(sender, reason: str = "", freed: bool = False, **kwargs) -> None:
    from . import memo
    from .tasks import enqueue_cycle

    try:
        if freed:
            memo.bump()
        enqueue_cycle(reason)
    except Exception:  # the broker is away: the periodic cycle will place it
        log.exception("could not enqueue a placement cycle (%s)", reason)


def _enqueue_housekeeping(sender, **kwargs) -> None:
    from .tasks import request_housekeeping

    try:
        request_housekeeping()
    except Exception:  # the broker is away: the periodic housekeeping deletes the pod
        log.exception("could not enqueue cluster housekeeping")


def _reconcile_on_start(sender=None, **kwargs) -> None:
    from .tasks import reconcile

    reconcile.delay()


class PlacementConfig(AppConfig):
    name = "portal.placement"
    label = "placement"

    def ready(self) -> None:
        from celery.signals import worker_ready

        from portal.cycle_requests import cycle_requested
        from portal.reservations.events import pod_ended

        cycle_requested.connect(_on_cycle_requested, dispatch_uid="placement-cycle-on-request")
        pod_ended.connect(_enqueue_housekeeping, dispatch_uid="placement-housekeeping-on-pod-ended")
        worker_ready.connect(_reconcile_on_start, dispatch_uid="placement-reconcile-on-start", weak=False)
