"""What teams hold against their quotas (portal.reservations.quota): the live allocations per team,
GPU model and admission, counted when placed and freed when released; and submit, which refuses
for quota only what can never run, reads the team's policy under its row lock."""

from dataclasses import astuple
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Count, Sum

from portal.reservations import rules, services
from portal.reservations.models import Allocation
from portal.reservations.quota import NO_USAGE, held, usage_by_team, usage_of
from tests.reservations import ended, placed, running, submitted

URL = "/api/v1/reservations/"


def test_database_is_postgresql_in_the_suite():
    # The README's test command runs the suite on PostgreSQL.
    import os

    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        assert connection.vendor == "postgresql"


def test_a_request_beyond_the_quota_is_accepted_and_counts_nothing_until_placed(client_for, fleet, reservation_body,
                                                                                teams):
    alice = client_for("alice")
    answers = [alice.post(URL, reservation_body(gpu_request=1.0), format="json") for _ in range(3)]
    assert [a.status_code for a in answers] == [201, 201, 201]
    # vision's quota is 2.0: the third would borrow if placed now (it is only a prediction until then).
    assert [a.json()["admission"] for a in answers] == ["guaranteed", "guaranteed", "guaranteed"]
    assert usage_of(teams["vision"]) == NO_USAGE


def test_what_a_team_holds_is_its_live_allocations_by_model_and_admission(people, fleet, teams):
    """held / usage_of / usage_by_team are precompiled statements (every cycle and quota page runs
    one): the same numbers as the ORM's own aggregate over live allocations."""
    vision, nlp = teams["vision"], teams["nlp"]
    by_model = {m: [g for g in fleet if g.model == m] for m in ("A100-80GB", "T4", "V100-32GB")}
    a100, t4 = by_model["A100-80GB"], by_model["T4"]
    assert held() == {} and usage_of(vision) == NO_USAGE
    submitted(people["alice"], vision, gpu_request="0.5", gpu_memory_mib=1000)  # waits: counts nothing
    placed(submitted(people["carol"], vision, gpu_request="0.333", gpu_memory_mib=333), a100[0])
    running(submitted(people["carol"], vision, gpu_request="0.2", gpu_memory_mib=10), a100[1], admission="borrowed")
    running(submitted(people["carol"], vision, gpu_request="1", gpu_memory_mib=100), t4[0])
    ended(running(submitted(people["carol"], vision, gpu_request="0.1", gpu_memory_mib=99), a100[2]))
    running(submitted(people["bob"], nlp, gpu_request="0.7", gpu_memory_mib=7000, priority=0), t4[1],
            admission="opportunistic")
    got = held()
    orm = {(r["reservation__team_id"], r["gpu__model"], r["reservation__admission"]):
           (Decimal(r["s"]).quantize(Decimal("0.001")), int(r["m"]), int(r["n"]))
           for r in Allocation.objects.filter(released_at__isnull=True)
           .values("reservation__team_id", "gpu__model", "reservation__admission")
           .annotate(s=Sum("gpu_request"), m=Sum("gpu_memory_mib"), n=Count("id"))}
    assert {k: astuple(v) for k, v in got.items()} == orm
    assert set(got) == {(vision.pk, "A100-80GB", "guaranteed"), (vision.pk, "A100-80GB", "borrowed"),
                        (vision.pk, "T4", "guaranteed"), (nlp.pk, "T4", "opportunistic")}
    assert held(vision.pk) == {k: v for k, v in got.items() if k[0] == vision.pk}
    # Guaranteed and borrowed count against quotas; opportunistic counts in none.
    assert usage_of(vision).as_dict() == {"gpu_share": "1.533", "memory_mib": 443, "gpus": 3}
    assert usage_of(nlp) == NO_USAGE
    assert usage_by_team() == {vision.pk: usage_of(vision)}
    assert all(type(v) is t for v, t in zip(astuple(usage_of(vision)), (Decimal, int, int), strict=True))


def test_submit_reads_the_policy_under_the_team_lock(people, fleet, teams, django_assert_num_queries):
    """The team row lock brings the team's policy in the same query (no policy query of its own),
    and the policy in force at that moment is the one applied."""
    from portal.audit import services as audit
    from portal.tenancy import policy, roles

    vision = teams["vision"]
    spec = rules.ReservationSpec(team=vision, image="busybox:1.36", gpu_request="0.1", gpu_memory_mib=100,
                                 priority=60)
    roles.team_roles(people["alice"])  # as the API has them by now (with the token)
    # fleet check, the team (locked, with its policy), the departments with their quotas, the
    # team's quotas, what it holds, two inserts; and the savepoint pair
    with django_assert_num_queries(9):
        services.submit(people["alice"], spec)
    policy.set_policy(vision, audit.cli("test"), {"max_priority_member": 50})  # `vision`: read before
    with pytest.raises(rules.RuleViolation) as refused:
        services.submit(people["alice"], rules.ReservationSpec(team=vision, image="busybox:1.36", gpu_request="0.1",
                                                               gpu_memory_mib=100, priority=60))
    assert "priority up to 50" in str(refused.value)
