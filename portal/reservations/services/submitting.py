"""Admit a request: validate it, check the team's quota under a lock, store it pending."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from django.db import transaction

from portal.reservations import rules
from portal.reservations.events import announce_reservations, request_cycle
from portal.reservations.models import Reservation, Source
from portal.reservations.quota import QuotaExceeded, over_quota, usage_of
from portal.reservations.states import State
from portal.tenancy import policy
from portal.tenancy.models import Team

from .audit import record


class KubectlPod(Protocol):
    """The user's own pod a kubectl reservation is for (`scheduler.backends.ExternalPod` is one)."""

    namespace: str
    name: str
    uid: str


def submit(user, spec: rules.ReservationSpec, source: str = Source.PORTAL, pod: KubectlPod | None = None
           ) -> Reservation:
    """Validate, admit against the team's quota under a row lock, store as pending.

    `source` says where the request came from; a kubectl one names the user's `pod`, which is
    the request itself and later the pod that runs it. A person's request keeps to the team's
    policy (priority ceiling of their role, longest duration); on the kubectl path the cluster's
    own access control stands for the person. The team row lock serialises concurrent
    submissions of one team, so two requests that together exceed the quota can never both be
    admitted.
    """
    if (source == Source.KUBECTL) != (pod is not None):
        raise ValueError("a kubectl reservation, and only one, names the pod it came from")
    rules.check(spec)  # also coerces the numbers in spec
    share = spec.gpu_request * spec.gpu_count
    memory = spec.gpu_memory_mib * spec.gpu_count
    with transaction.atomic():
        # The lock also orders this read of the policy after any change to it (set_policy and
        # set_limits lock the team row too), and brings the policy in the same query.
        team = Team.objects.select_for_update(of=("self",)).select_related("policy").get(pk=spec.team.pk)
        if source != Source.KUBECTL:
            problems = policy.request_problems(user, team, priority=spec.priority,
                                               max_duration_s=spec.max_duration_s, remote_allowed=spec.remote_allowed)
            if problems:
                raise rules.RuleViolation(problems)
        usage = usage_of(team)
        problem = over_quota(team, usage, share, memory, spec.gpu_count)
        opportunistic = False
        if problem:
            if spec.priority == 0 and team.allow_over_quota:
                opportunistic = True
            else:
                if not team.allow_over_quota:
                    problem += f"; team {team.slug} does not allow over-quota use"
                else:
                    problem += "; priority-0 (opportunistic, preemptible) requests may run beyond the quota"
                raise QuotaExceeded(problem, team, usage)
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "team"}
        if pod is not None:
            fields |= {"pod_namespace": pod.namespace, "pod_name": pod.name, "pod_uid": pod.uid}
        reservation = Reservation.objects.create(
            owner=user, team=team, opportunistic=opportunistic, source=source,
            state_reason="waiting for the next placement cycle", **fields,
        )
        why = "submitted" + (" as opportunistic (over quota)" if opportunistic else "")
        record(reservation, "", State.PENDING, user, why)
        announce_reservations({reservation.pk: team.pk})
        request_cycle("submitted")
    return reservation
