"""portal.precompiled: a query compiled once gives what the ORM gives, call after call."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.db.models.functions import Coalesce
from django.test.utils import CaptureQueriesContext

from portal.fleet.models import Node
from portal.precompiled import Precompiled
from portal.reservations.models import Reservation
from portal.reservations.quota import _counted, _totals, usage_by_team
from portal.reservations.rules import ReservationSpec
from portal.reservations.services import submit

pytestmark = pytest.mark.django_db


def _submit(person, team, share: str, count: int = 1):
    return submit(person, ReservationSpec(team=team, image="img", gpu_request=Decimal(share), gpu_memory_mib=1024,
                                          gpu_count=count))


def test_rows_are_the_orms_for_every_kind_of_column(fleet, teams, people):
    _submit(people["alice"], teams["vision"], "1", 2)
    _submit(people["bob"], teams["nlp"], "0.5")
    querysets = [
        # decimals, datetimes, text, a join
        lambda: Reservation.objects.order_by("pk").values_list("pk", "gpu_request", "created_at", "team__slug"),
        lambda: Reservation.objects.order_by("pk").values_list("gpu_request", flat=True),
        lambda: Node.objects.order_by("name").values_list("name", "labels"),  # JSON: converted by from_db_value
        lambda: Reservation.objects.order_by().values_list(Coalesce("client_node_id", "team_id"), flat=True),
        # aggregates whose expressions convert their values
        lambda: _counted().values("team_id").annotate(**_totals()).order_by("team_id")
        .values_list("team_id", "share", "memory", "gpus"),
    ]
    for make in querysets:
        compiled = Precompiled(make)
        expected = list(make())
        assert expected
        assert compiled.all() == expected
        assert [type(v) for row in compiled.all() for v in (row if isinstance(row, tuple) else (row,))] == \
            [type(v) for row in expected for v in (row if isinstance(row, tuple) else (row,))]


def test_later_calls_see_new_rows_and_compile_nothing(fleet, teams, people):
    compiled = Precompiled(lambda: Reservation.objects.filter(state="pending").order_by("pk").values_list("pk",
                                                                                                           flat=True))
    assert compiled.all() == []
    first = _submit(people["alice"], teams["vision"], "0.25")
    with CaptureQueriesContext(connection) as queries:
        assert compiled.all() == [first.pk]
    assert len(queries) == 1


def test_usage_by_team_counts_active_guaranteed_use(fleet, teams, people):
    _submit(people["alice"], teams["vision"], "1", 2)
    _submit(people["bob"], teams["nlp"], "0.5")
    used = usage_by_team()
    assert used[teams["vision"].pk].gpu_share == Decimal("2.000")
    assert used[teams["vision"].pk].gpus == 2
    assert used[teams["nlp"].pk].memory_mib == 1024


def test_only_values_list_querysets():
    with pytest.raises(TypeError):
        Precompiled(lambda: Reservation.objects.all()).all()
