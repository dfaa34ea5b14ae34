"""A request's priority is capped by the team's policy for the person's role, on every path a
person submits by (API, pages); the kubectl path is the cluster's to govern."""

from types import SimpleNamespace

import pytest

from portal.reservations import services
from portal.reservations.models import Source
from portal.reservations.rules import ReservationSpec, RuleViolation
from portal.tenancy.models import TeamPolicy


@pytest.fixture
def ceilings(teams):
    TeamPolicy.objects.create(team=teams["vision"], max_priority_member=40, max_priority_admin=80)


def _submit(client, priority):
    return client.post("/api/v1/reservations/", {"team": "vision", "image": "img", "gpu_request": 0.25,
                                                 "gpu_memory_mib": 1024, "priority": priority}, format="json")


@pytest.mark.parametrize(("who", "allowed", "refused"), [("alice", 40, 41), ("carol", 80, 81), ("admin", 100, None)])
def test_priority_ceiling_per_role(client_for, fleet, ceilings, who, allowed, refused):
    client = client_for(who)
    assert _submit(client, allowed).status_code == 201
    if refused is not None:
        r = _submit(client, refused)
        assert r.status_code == 400
        assert f"up to {allowed}" in r.json()["priority"][0]


def test_default_policy_lets_members_use_any_priority(client_for, fleet, teams):
    assert _submit(client_for("alice"), 100).status_code == 201


def test_the_service_refuses_it_for_pages_too_and_kubectl_path_is_exempt(people, fleet, ceilings, teams):
    spec = dict(team=teams["vision"], image="img", command=[], gpu_request=0.25, gpu_memory_mib=1024, priority=90)
    with pytest.raises(RuleViolation) as exc:
        services.submit(people["alice"], ReservationSpec(**spec))
    assert "priority" in exc.value.errors
    pod = SimpleNamespace(namespace="vision", name="train", uid="uid-train")
    assert services.submit(people["alice"], ReservationSpec(**spec), source=Source.KUBECTL, pod=pod).priority == 90
