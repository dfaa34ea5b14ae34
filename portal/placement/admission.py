"""Admit the kubectl path's pods: each new pending pod with `schedulerName: tessera` becomes a
pending reservation (its labels read by `kubectl_labels`), or gets a Warning Event saying what is
wrong with it. Cluster I/O: runs in its own task, never inside a placement cycle."""

from __future__ import annotations

import logging

from django.contrib.auth import get_user_model
from django.db import IntegrityError

from portal.reservations import services
from portal.reservations.engine_quotas import NeverFits
from portal.reservations.models import Reservation, Source
from portal.reservations.rules import RuleViolation
from scheduler.backends import Backend, BackendError

from .kubectl_labels import spec_from_pod

log = logging.getLogger(__name__)
SYSTEM_USER = "tessera-kubectl"


def system_user():
    user, created = get_user_model().objects.get_or_create(username=SYSTEM_USER, defaults={"is_active": False})
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def ingest(backend: Backend) -> tuple[int, int]:
    """Turn new pending kubectl pods into pending reservations. Returns (admitted, rejected)."""
    try:
        pods = backend.list_pending_external()
    except BackendError as exc:
        log.warning("cannot list pending kubectl pods: %s", exc)
        return 0, 0
    if not pods:
        return 0, 0
    known = set(Reservation.objects.filter(source=Source.KUBECTL, pod_uid__in=[p.uid for p in pods])
                .values_list("pod_uid", flat=True))
    admitted = rejected = 0
    for pod in pods:
        if pod.uid in known:
            continue
        try:
            spec = spec_from_pod(pod)
            services.submit(system_user(), spec, source=Source.KUBECTL, pod=pod)
            admitted += 1
        except (RuleViolation, NeverFits) as exc:
            rejected += 1
            try:
                backend.reject_external(pod.ref, f"tessera: {exc}"[:1000])
            except BackendError as err:
                log.warning("cannot record an Event on %s/%s: %s", pod.namespace, pod.name, err)
        except IntegrityError:
            continue  # another cycle admitted this pod at the same moment
    return admitted, rejected
