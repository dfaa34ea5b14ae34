"""Quota admission: refused with 409 naming the quota and the use, opportunistic beyond it where the
team allows, and exact under real concurrent submissions on PostgreSQL."""

import threading
from decimal import Decimal

import pytest
from django.db import connection, connections

from portal.reservations import rules, services
from portal.reservations.models import Reservation
from portal.reservations.quota import QuotaExceeded, usage_of

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
    teams["nlp"].quota_gpu_share = Decimal("10")
    teams["nlp"].save()
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
