"""The proxy's per-request recheck of a remembered "yes" (portal.connect.recheck), on PostgreSQL:
what it answers as the facts it checks change, many checks in flight on its one connection, and a
connection that breaks under it."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client

from portal.connect import proxy
from portal.connect.recheck import Recheck, RecheckFailed, available
from portal.reservations import services
from portal.reservations.models import Reservation
from portal.reservations.states import State
from tests.reservations import ended, running, submitted

pytestmark = pytest.mark.django_db(transaction=True)  # the recheck reads on a connection of its own


@pytest.fixture
def remembered(fleet, teams, people):
    """alice's running notebook and what the proxy decided for her session: (reservation, decision)."""
    if not available():
        pytest.skip("the recheck needs PostgreSQL")
    r = submitted(people["alice"], teams["vision"], gpu_request=Decimal("0.25"), gpu_memory_mib=4096,
                  kind="interactive", app="jupyter")
    # Committed at once here: the submit's placement cycle (Celery, eagerly) may have placed it.
    state = Reservation.objects.get(pk=r.pk).state
    if state == State.PENDING:
        running(r, fleet.first())
    elif state == State.PLACED:
        assert services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", "test")
    r = Reservation.objects.get(pk=r.pk)
    assert r.state == State.RUNNING and r.pod_name
    client = Client()
    client.force_login(people["alice"])
    decision = proxy.decide_access(client.session.session_key, r.pk)
    assert decision.target is not None and decision.recheck is not None
    return r, decision, client


def holds(checks: list[list[bytes]]) -> list[bool]:
    """The answers to `checks`, all sent at once on one Recheck."""
    async def run() -> list[bool]:
        recheck = Recheck()
        try:
            return await asyncio.gather(*(recheck.holds(params) for params in checks))
        finally:
            recheck.close()
    return asyncio.run(run())


def with_(params: list[bytes], index: int, value: str) -> list[bytes]:
    return [*params[:index], value.encode(), *params[index + 1:]]


def test_a_remembered_yes_holds_until_what_it_read_changes(remembered, people):
    r, decision, client = remembered
    params = decision.recheck
    assert holds([params]) == [True]
    assert holds([with_(params, 6, "another-pod")]) == [False]  # the pod was replaced: decide again
    Reservation.objects.filter(pk=r.pk).update(owner=people["carol"])
    assert holds([params]) == [False]
    Reservation.objects.filter(pk=r.pk).update(owner=people["alice"])
    assert holds([params]) == [True]
    client.logout()
    assert holds([params]) == [False]


def test_an_ended_reservation_does_not_hold(remembered):
    r, decision, _client = remembered
    ended(Reservation.objects.get(pk=r.pk), "expired", "its time ran out")
    assert holds([decision.recheck]) == [False]


def test_many_checks_in_flight_share_the_connection_and_come_back_in_order(remembered):
    _r, decision, _client = remembered
    params = decision.recheck
    checks = [params if i % 3 else with_(params, 2, str(10_000 + i)) for i in range(60)]
    assert holds(checks) == [bool(i % 3) for i in range(60)]


def test_a_broken_connection_fails_the_check_and_the_next_one_connects_again(remembered):
    _r, decision, _client = remembered

    async def run() -> tuple[bool, object, bool, bool]:
        recheck = Recheck()
        try:
            first = await recheck.holds(decision.recheck)
            pid = recheck.backend_pid
            await asyncio.to_thread(_terminate, pid)
            # Whether the loop saw the connection go before this check was sent (then it connects
            # again and answers) or after (then the check fails: the proxy decides in full): never
            # a wrong answer, never a hang.
            try:
                during = await asyncio.wait_for(recheck.holds(decision.recheck), 30)
            except RecheckFailed:
                during = RecheckFailed
            after = await recheck.holds(decision.recheck)
            return first, during, after, recheck.backend_pid != pid
        finally:
            recheck.close()

    first, during, after, new_connection = asyncio.run(run())
    assert first is True and during in (True, RecheckFailed) and after is True and new_connection


def _terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    connection.close()  # this thread's connection
