"""Admit a request: validate it, check the team's quota under a lock, store it pending."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from django.db import transaction

from portal.cycle_requests import request_cycle
from portal.fleet.model_names import fleet_model_names
from portal.reservations import engine_quotas, rules
from portal.reservations.events import announce_reservations
from portal.reservations.models import Reservation, Source
from portal.reservations.quota import held
from portal.reservations.requests import request_of
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
    """Validate, refuse what can never run, store as pending (quota is charged when placed).

    `source` says where the request came from; a kubectl one names the user's `pod`, which is
    the request itself and later the pod that runs it. A person's request keeps to the team's
    policy (priority ceiling of their role, longest duration); on the kubectl path the cluster's
    own access control stands for the person. A request beyond its team's quota is not refused:
    it borrows or waits (the placement cycle decides); only one beyond a hard limit of its team is
    (engine_quotas.NeverFits).
    """
    if (source == Source.KUBECTL) != (pod is not None):
        raise ValueError("a kubectl reservation, and only one, names the pod it came from")
    rules.check(spec)  # also coerces the numbers in spec
    with transaction.atomic():
        # The lock also orders this read of the policy after any change to it (set_policy and
        # set_limits lock the team row too), and brings the policy in the same query.
        team = Team.objects.select_for_update(of=("self",)).select_related("policy").get(pk=spec.team.pk)
        if source != Source.KUBECTL:
            problems = policy.request_problems(user, team, priority=spec.priority,
                                               max_duration_s=spec.max_duration_s, remote_allowed=spec.remote_allowed)
            if problems:
                raise rules.RuleViolation(problems)
        admission = _admission_now(team, spec)
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "team"}
        if pod is not None:
            fields |= {"pod_namespace": pod.namespace, "pod_name": pod.name, "pod_uid": pod.uid}
        reservation = Reservation.objects.create(
            owner=user, team=team, admission=admission, source=source,
            state_reason="waiting for the next placement cycle", **fields,
        )
        record(reservation, "", State.PENDING, user, f"submitted ({admission} if placed now)")
        announce_reservations({reservation.pk: team.pk})
        request_cycle("submitted")
    return reservation


def _admission_now(team: Team, spec: rules.ReservationSpec) -> str:
    """Refuse what can never run (the only refusal for quota); else how the request would count if
    placed now as far as its own team's quota goes (the cycle decides for good when it places it)."""
    tree = engine_quotas.path_tree(team)
    request = request_of(spec, team.slug, "submit")
    models = engine_quotas.models_to_judge(tree, team.slug, spec.models(), fleet_model_names)
    problem = engine_quotas.never_fits(tree, request, models)
    if problem:
        raise engine_quotas.NeverFits(f"team {team.slug}: this request can never run as asked: {problem}", team)
    return engine_quotas.admission_now(tree, request, models, held(team.pk))
