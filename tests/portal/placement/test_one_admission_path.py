"""One admission path: submit, the request page's preview, `/api/v1/capacity/` and the placement
cycle judge the same request the same way (the request built by `reservations.requests`, the
verdicts of `scheduler.core.fairshare`), on cases where they used to disagree: exclusion groups
(team-scoped), the pod's own CPU and memory on its node, quotas, and a request that can never run."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node
from portal.reservations import rules
from portal.reservations.models import Reservation
from portal.reservations.states import HOLDS_GPU
from portal.tenancy import quotas
from portal.web import preview as previews
from tests.reservations import running, submitted

ADMIN = audit.cli("test")
NO_LENDING = {"gpu_share": "0", "gpu_memory_gib": "0", "gpus": 0}


@dataclass
class Answer:
    fits: bool
    admission: str | None
    never: bool


def _spec(team, **terms) -> rules.ReservationSpec:
    spec = rules.ReservationSpec(team=team, image="busybox:1.36", **terms)
    rules.check(spec)
    return spec


def _four(people, team, user, placement_loop, **terms) -> dict[str, Answer]:
    """The preview's, the capacity API's, submit's and the cycle's answers for one request."""
    previews.forget_snapshot()
    p = previews.preview(_spec(team, **terms))
    client = APIClient()
    client.force_authenticate(people[user])
    query = {"gpu_request": str(terms["gpu_request"]), "gpu_memory_mib": terms["gpu_memory_mib"],
             "gpu_count": terms.get("gpu_count", 1), "gpu_model": terms.get("gpu_model", ""), "team": team.slug,
             **{k: terms[k] for k in ("exclusion", "priority") if k in terms}}
    capacity = client.get("/api/v1/capacity/", query).json()
    body = {"team": team.slug, "image": "busybox:1.36", **{k: (str(v) if isinstance(v, Decimal) else v)
                                                          for k, v in terms.items()}}
    posted = client.post("/api/v1/reservations/", body, format="json")
    answers = {"preview": Answer(p.fits_now, p.admission or None, p.never),
               "capacity": Answer(capacity["fits"], capacity["admission"], capacity["never"])}
    if posted.status_code == 409:
        assert posted.json()["code"] == "never_fits"
        answers["submit"] = answers["cycle"] = Answer(False, None, True)
        return answers
    assert posted.status_code == 201, posted.content
    answers["submit"] = Answer(True, None, False)  # accepted: submit refuses nothing else for quota
    placement_loop()
    r = Reservation.objects.get(pk=posted.json()["id"])
    held = r.state in HOLDS_GPU
    answers["cycle"] = Answer(held, r.admission if held else None, False)
    return answers


def _agree(answers: dict[str, Answer]) -> Answer:
    expected = answers["cycle"]
    for name in ("preview", "capacity"):
        assert answers[name] == expected, (name, answers)
    assert answers["submit"].never == expected.never
    return expected


def test_exclusion_groups_are_the_teams_own(people, teams, fleet, placement_loop):
    """vision's `secure` group may join the T4 holding vision's secure work, not nlp's `secure`
    work (another team's group of the same name) nor unlabelled work."""
    from portal.tenancy.models import ExclusionGroup

    ExclusionGroup.objects.create(team=teams["nlp"], label="secure")
    t4 = list(Gpu.objects.filter(model="T4").order_by("index"))
    running(submitted(people["bob"], teams["nlp"], gpu_request="0.5", gpu_memory_mib=1000, exclusion="secure"), t4[0])
    running(submitted(people["alice"], teams["vision"], gpu_request="0.5", gpu_memory_mib=1000, exclusion="secure"),
            t4[1])
    got = _agree(_four(people, teams["vision"], "alice", placement_loop, gpu_request=Decimal("0.5"),
                       gpu_memory_mib=1000, gpu_model="T4", exclusion="secure"))
    assert got.fits and got.admission == "guaranteed"
    newest = Reservation.objects.latest("pk")
    assert newest.allocations.get().gpu_id == t4[1].pk
    # A second one finds no T4 its group may use: all four say it waits.
    got = _agree(_four(people, teams["vision"], "alice", placement_loop, gpu_request=Decimal("0.5"),
                       gpu_memory_mib=1000, gpu_model="T4", exclusion="secure"))
    assert not got.fits


def test_the_pods_own_cpu_and_memory_count_on_its_node(people, teams, fleet, placement_loop, settings):
    settings.TESSERA_POD_CPU_MILLI = 4000
    for node in Node.objects.all():
        fleet_services.record_resources(node.pk, 2000, 64_000)  # every node: less CPU than one pod asks
    got = _agree(_four(people, teams["vision"], "alice", placement_loop, gpu_request=Decimal("0.25"),
                       gpu_memory_mib=1000))
    assert not got.fits
    preview = previews.preview(_spec(teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=1000))
    assert any(r["code"] == "node_cpu" for r in preview.reasons)


@pytest.mark.parametrize("second", ["waits", "borrows"])
def test_quotas(people, teams, fleet, placement_loop, second):
    quotas.replace_quotas(teams["vision"], ADMIN, [{"gpu_model": "T4", "gpu_share": "1", "gpu_memory_gib": "16",
                                                    "gpus": 1}])
    lend = NO_LENDING if second == "waits" else None
    quotas.replace_quotas(teams["nlp"], ADMIN, [{"gpu_model": "T4", "gpu_share": "1", "gpu_memory_gib": "16",
                                                 "gpus": 1, "lending_limit": lend}])
    terms = {"gpu_request": Decimal("1"), "gpu_memory_mib": 15_000, "gpu_model": "T4"}
    first = _agree(_four(people, teams["vision"], "alice", placement_loop, **terms))
    assert first.fits and first.admission == "guaranteed"
    got = _agree(_four(people, teams["vision"], "alice", placement_loop, **terms))
    assert (got.fits, got.admission) == ((False, None) if second == "waits" else (True, "borrowed"))


def test_never_fits(people, teams, fleet, placement_loop):
    quotas.replace_quotas(teams["nlp"], ADMIN, [{"gpu_model": "*", "gpu_share": "1.5", "gpu_memory_gib": "100",
                                                 "gpus": 3, "borrowing_limit": {"gpu_share": "0.5",
                                                                                "gpu_memory_gib": None,
                                                                                "gpus": None}}])
    got = _agree(_four(people, teams["nlp"], "bob", placement_loop, gpu_request=Decimal("1"), gpu_memory_mib=1000,
                       gpu_count=3))
    assert got.never and not got.fits
    assert not Reservation.objects.filter(team=teams["nlp"]).exists()
