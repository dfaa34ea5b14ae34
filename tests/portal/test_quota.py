"""Quota admission: refused with 409 naming the quota and the use, opportunistic beyond it where the
team allows, and exact under real concurrent submissions on PostgreSQL."""

import threading
from dataclasses import astuple
from decimal import Decimal

import pytest
from django.db import connection, connections

from portal.audit import services as audit
from portal.reservations import rules, services
from portal.reservations.models import Reservation
from portal.reservations.quota import QuotaExceeded, usage_of
from portal.tenancy.teams import set_quota

URL = "/api/v1/reservations/"


def test_over_share_quota_is_409_naming_quota_and_use(client_for, fleet, reservation_body):
    alice = client_for("alice")
    for _ in range(3):
        assert alice.post(URL, reservation_body(gpu_request=0.6), format="json").status_code == 201
    r = alice.post(URL, reservation_body(gpu_request=0.3), format="json")
    assert r.status_code == 409
    body = r.json()
    assert body["code"] == "quota_exceeded"
    assert "GPU share quota is 2.000; 1.800 is in use and this request needs 0.300" in body["detail"]
    assert body["in_use"]["gpu_share"] == "1.800"
    assert Reservation.objects.count() == 3


def test_priority_zero_beyond_quota_runs_opportunistic_where_allowed(client_for, fleet, reservation_body, teams):
    alice = client_for("alice")
    alice.post(URL, reservation_body(gpu_request=1.0, gpu_count=2), format="json")
    r = alice.post(URL, reservation_body(gpu_request=0.5, priority=0), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["opportunistic"] is True
    # Opportunistic use is not counted against the quota.
    assert usage_of(teams["vision"]).gpu_share == Decimal("2.000")


def test_priority_zero_refused_where_team_forbids_over_quota(client_for, fleet, reservation_body):
    bob = client_for("bob")
    assert bob.post(URL, reservation_body(team="nlp", gpu_request=1.0), format="json").status_code == 201
    r = bob.post(URL, reservation_body(team="nlp", gpu_request=0.75, priority=0), format="json")
    assert r.status_code == 409
    assert "does not allow over-quota use" in r.json()["detail"]


def test_memory_and_gpu_count_quotas(client_for, fleet, reservation_body, teams):
    set_quota(teams["nlp"], audit.cli("test"), {"quota_gpu_share": 10})
    bob = client_for("bob")
    assert bob.post(URL, reservation_body(team="nlp", gpu_memory_mib=60000), format="json").status_code == 201
    r = bob.post(URL, reservation_body(team="nlp", gpu_memory_mib=50000), format="json")
    assert r.status_code == 409 and "GPU memory quota is 100000 MiB; 60000 MiB is in use" in r.json()["detail"]
    r = bob.post(URL, reservation_body(team="nlp", gpu_count=3, gpu_request=1.0, gpu_memory_mib=1000), format="json")
    assert r.status_code == 409 and "at most 3 GPUs at once; 1 are in use" in r.json()["detail"]


def test_cancelled_reservations_free_their_quota(client_for, fleet, reservation_body):
    alice = client_for("alice")
    ids = [alice.post(URL, reservation_body(gpu_request=1.0), format="json").json()["id"] for _ in range(2)]
    assert alice.post(URL, reservation_body(gpu_request=0.5), format="json").status_code == 409
    assert alice.post(f"{URL}{ids[0]}/cancel/").status_code == 200
    assert alice.post(URL, reservation_body(gpu_request=0.5), format="json").status_code == 201


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_exceed_quota(people, fleet, teams):
    """Eight threads, each with its own PostgreSQL connection, race to take 0.6 of a 2.0 quota:
    exactly three win, and the total never passes the quota."""
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker():
        try:
            barrier.wait()
            spec = rules.ReservationSpec(team=teams["vision"], image="busybox:1.36",
                                         gpu_request=Decimal("0.6"), gpu_memory_mib=1024)
            try:
                services.submit(people["alice"], spec)
                result = "won"
            except QuotaExceeded:
                result = "refused"
            with lock:
                outcomes.append(result)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 5 + ["won"] * 3
    assert usage_of(teams["vision"]).gpu_share == Decimal("1.800")


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.django_db(transaction=True)
def test_two_simultaneous_submissions_exactly_one_wins(people, fleet, teams):
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def worker():
        try:
            barrier.wait()
            spec = rules.ReservationSpec(team=teams["nlp"], image="busybox:1.36", gpu_request=Decimal("1.0"),
                                         gpu_memory_mib=1024)
            try:
                services.submit(people["bob"], spec)
                outcomes.append("won")
            except QuotaExceeded:
                outcomes.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused", "won"]
    assert Reservation.objects.filter(team=teams["nlp"]).count() == 1


def test_database_is_postgresql_in_the_suite():
    # The README's test command runs the suite on PostgreSQL; the concurrency tests must not skip there.
    import os

    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        assert connection.vendor == "postgresql"


def test_usage_of_and_usage_by_team_say_what_the_orm_aggregate_says(people, fleet, teams):
    """usage_of and usage_by_team are precompiled statements (every submit, capacity preview and
    cycle runs one): the same numbers as the ORM's aggregate over the counted reservations, over
    every state, opportunistic or not, multi-GPU."""
    from portal.reservations.quota import NO_USAGE, _counted, _totals, usage_by_team
    from tests.reservations import ended, placed, running, submitted

    vision, nlp = teams["vision"], teams["nlp"]
    set_quota(vision, audit.cli("test"), {"quota_gpu_share": 10, "quota_max_gpus": 10})
    gpus = list(fleet)
    assert usage_of(vision) == usage_of(nlp) == NO_USAGE
    submitted(people["alice"], vision, gpu_request="0.125", gpu_memory_mib=1000)
    submitted(people["alice"], vision, gpu_request="1", gpu_memory_mib=20000, gpu_count=2)
    submitted(people["alice"], vision, gpu_request="0.3", gpu_memory_mib=7, priority=0)  # within quota
    placed(submitted(people["carol"], vision, gpu_request="0.333", gpu_memory_mib=333), gpus[0])
    running(submitted(people["carol"], vision, gpu_request="0.2", gpu_memory_mib=10), gpus[1])
    ended(running(submitted(people["carol"], vision, gpu_request="0.1", gpu_memory_mib=99), gpus[2]))
    services.cancel(submitted(people["alice"], vision, gpu_request="0.05", gpu_memory_mib=5).pk, people["alice"])
    submitted(people["bob"], nlp, gpu_request="0.7", gpu_memory_mib=70000)
    Reservation.objects.filter(team=nlp).update(opportunistic=True)  # as if admitted beyond the quota
    submitted(people["bob"], nlp, gpu_request="0.001", gpu_memory_mib=1)
    by_team = usage_by_team()
    orm = {row["team_id"]: row for row in _counted().values("team_id").annotate(**_totals())}
    assert set(by_team) == set(orm) == {vision.pk, nlp.pk}
    for team in (vision, nlp):
        row = orm[team.pk]
        expected = (Decimal(row["share"]).quantize(Decimal("0.001")), int(row["memory"]), int(row["gpus"]))
        assert (by_team[team.pk].gpu_share, by_team[team.pk].memory_mib, by_team[team.pk].gpus) == expected
        assert usage_of(team) == usage_of(team.pk) == by_team[team.pk]
        assert all(type(v) is t for v, t in zip(astuple(by_team[team.pk]), (Decimal, int, int), strict=True))
    got = usage_of(vision)
    assert got.as_dict() == {"gpu_share": "2.958", "memory_mib": 41350, "gpus": 6}
    assert type(got.gpu_share) is Decimal and type(got.memory_mib) is int and type(got.gpus) is int
    assert usage_of(nlp).as_dict() == {"gpu_share": "0.001", "memory_mib": 1, "gpus": 1}


def test_submit_reads_the_policy_under_the_team_lock(people, fleet, teams, django_assert_num_queries):
    """The team row lock brings the team's policy in the same query (no policy query of its own),
    and the policy in force at that moment is the one applied."""
    from portal.audit import services as audit
    from portal.tenancy import policy, roles

    vision = teams["vision"]
    spec = rules.ReservationSpec(team=vision, image="busybox:1.36", gpu_request="0.1", gpu_memory_mib=100,
                                 priority=60)
    roles.team_roles(people["alice"])  # as the API has them by now (with the token)
    # fleet check, the team (locked, with its policy), usage, two inserts; and the savepoint pair
    with django_assert_num_queries(7):
        services.submit(people["alice"], spec)
    policy.set_policy(vision, audit.cli("test"), {"max_priority_member": 50})  # `vision`: read before
    with pytest.raises(rules.RuleViolation) as refused:
        services.submit(people["alice"], rules.ReservationSpec(team=vision, image="busybox:1.36", gpu_request="0.1",
                                                               gpu_memory_mib=100, priority=60))
    assert "priority up to 50" in str(refused.value)
