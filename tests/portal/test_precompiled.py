"""portal.precompiled: a query compiled once gives what the ORM gives, call after call, with
whatever values its parameters take (PostgreSQL here; SQLite in a subprocess below)."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import DecimalField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Coalesce
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from portal.fleet.models import Gpu, Node
from portal.precompiled import Precompiled, param_eq, param_in
from portal.reservations import services
from portal.reservations.models import Allocation, Reservation
from portal.reservations.quota import usage_by_team
from portal.reservations.rules import ReservationSpec
from portal.reservations.services import submit
from portal.reservations.states import ACTIVE

pytestmark = pytest.mark.django_db


def _submit(person, team, share: str, count: int = 1):
    return submit(person, ReservationSpec(team=team, image="img", gpu_request=Decimal(share), gpu_memory_mib=1024,
                                          gpu_count=count))


def _counted():
    return Reservation.objects.filter(state__in=ACTIVE)


def _totals() -> dict:
    """Sums whose expressions convert their values (decimal products, a count)."""
    share = ExpressionWrapper(F("gpu_request") * F("gpu_count"), output_field=DecimalField(max_digits=8,
                                                                                           decimal_places=3))
    memory = ExpressionWrapper(F("gpu_memory_mib") * F("gpu_count"), output_field=DecimalField(max_digits=14,
                                                                                               decimal_places=0))
    return {"share": Coalesce(Sum(share), Value(Decimal(0))), "memory": Coalesce(Sum(memory), Value(Decimal(0))),
            "gpus": Coalesce(Sum("gpu_count"), Value(0))}


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


def test_usage_by_team_counts_what_is_held(fleet, teams, people):
    from tests.reservations import placed

    gpus = list(fleet.filter(model="A100-80GB"))
    placed(_submit(people["alice"], teams["vision"], "1"), gpus[0])
    placed(_submit(people["bob"], teams["nlp"], "0.5"), gpus[1])
    _submit(people["alice"], teams["vision"], "1", 2)  # waiting: holds nothing
    used = usage_by_team()
    assert used[teams["vision"].pk].gpu_share == Decimal("1.000")
    assert used[teams["vision"].pk].gpus == 1
    assert used[teams["nlp"].pk].memory_mib == 1024


def test_only_model_and_values_list_querysets():
    for make in (lambda: Reservation.objects.values("pk"), lambda: Reservation.objects.values_list("pk", named=True),
                 lambda: Reservation.objects.prefetch_related("allocations")):
        with pytest.raises(TypeError):
            Precompiled(make).all()


# Queries with parameters, each as (its parameters, how it is built from the two kinds of filter):
# Precompiled gets param_eq/param_in, the ORM plain filters with the same values.
PARAMETERISED = [
    # decimals, datetimes, a join; the order asked for, whatever the order of the ids
    (("ids",), lambda eq, any_of: Reservation.objects.filter(any_of("pk", "ids")).order_by("-pk")
     .values_list("pk", "gpu_request", "created_at", "team__slug")),
    # nodes_holding's form: a join, DISTINCT, flat
    (("ids",), lambda eq, any_of: Allocation.objects.filter(any_of("reservation_id", "ids"), released_at__isnull=True)
     .order_by("gpu__node_id").values_list("gpu__node_id", flat=True).distinct()),
    # a value and a list, constants beside them, aggregates whose expressions convert their values
    (("team", "ids"), lambda eq, any_of: _counted().filter(eq("team_id", "team"), any_of("pk", "ids"))
     .values("team_id").annotate(**_totals()).order_by("team_id").values_list("team_id", "share", "memory", "gpus")),
    # model instances: deferred fields, select_related, locked (place_many's form)
    (("ids",), lambda eq, any_of: Reservation.objects.select_for_update(of=("self",)).select_related("team")
     .only("state", "gpu_limit", "attempt", "team__interactive_max_s").filter(any_of("pk", "ids")).order_by("pk")),
    (("ids",), lambda eq, any_of: Gpu.objects.select_for_update().filter(any_of("pk", "ids")).order_by("pk")
     .only("node_id", "uuid", "memory_mib")),
    (("node",), lambda eq, any_of: Gpu.objects.filter(eq("node_id", "node")).order_by("index")),
]


def _loaded(obj):
    """What a model instance holds: its class, loaded values, deferred fields and cached relations."""
    if not hasattr(obj, "_meta"):
        return obj, type(obj)
    values = {f.attname: (obj.__dict__[f.attname], type(obj.__dict__[f.attname])) for f in obj._meta.concrete_fields
              if f.attname in obj.__dict__}
    related = {name: _loaded(value) for name, value in obj._state.fields_cache.items()}
    return type(obj), values, obj.get_deferred_fields(), obj._state.db, obj._state.adding, related


def same_as_the_orm(teams: list[int]) -> int:
    """Every parameterised query, precompiled once, against the ORM's rows for each set of values
    (empty lists, unknown and repeated ids included). Returns the comparisons made."""
    ids = sorted(Reservation.objects.values_list("pk", flat=True))
    gpus = sorted(Allocation.objects.values_list("gpu_id", flat=True))
    nodes = sorted(Gpu.objects.filter(pk__in=gpus).values_list("node_id", flat=True))
    assert len(ids) >= 3 and gpus and nodes
    values = [{"ids": [], "team": teams[0], "node": nodes[0]},
              {"ids": [ids[1]], "team": teams[0], "node": nodes[-1]},
              {"ids": [ids[-1], 10**9, *ids[:2], ids[0]], "team": teams[-1], "node": 10**9},
              {"ids": ids + gpus, "team": teams[-1], "node": nodes[0]}]
    made = 0
    with transaction.atomic():
        for names, build in PARAMETERISED:
            compiled = Precompiled(lambda build=build: build(param_eq, param_in))
            for given in values:
                orm = build(lambda field, name, given=given: Q(**{field: given[name]}),
                            lambda field, name, given=given: Q(**{f"{field}__in": given[name]}))
                expected = [_loaded(row) for row in orm]
                got = [_loaded(row) for row in compiled.all(**{name: given[name] for name in names})]
                assert got == expected, (names, given)
                made += 1
    return made


def test_parameterised_rows_are_the_orms(fleet, teams, people):
    vision = [_submit(people["alice"], teams["vision"], share) for share in ("0.25", "0.5", "1")]
    nlp = _submit(people["bob"], teams["nlp"], "0.125")
    gpus = list(Gpu.objects.order_by("pk")[:2])
    services.place_many([[services.Placing(r.pk, gpu.node_id, (services.NewAllocation(gpu.pk, r.gpu_request, 512),))]
                         for r, gpu in zip((vision[0], nlp), gpus, strict=True)])
    assert same_as_the_orm([teams["vision"].pk, teams["nlp"].pk]) == len(PARAMETERISED) * 4


def test_the_same_on_sqlite(on_sqlite):
    """The quickstart runs on SQLite: lists are expanded into IN (...), an empty one into IN ()."""
    lines = on_sqlite("""
        from decimal import Decimal
        from django.contrib.auth import get_user_model
        from portal.fleet import inventory
        from portal.fleet.models import Gpu
        from portal.reservations import rules, services
        from portal.tenancy.models import Membership, Team
        from tests.teams import make_team
        from tests.portal.test_precompiled import PARAMETERISED, same_as_the_orm
        inventory.load(os.environ["INVENTORY"])
        teams = [make_team(s, name=s, quota_gpu_share=Decimal(10), quota_memory_mib=10**7,
                                     quota_max_gpus=10) for s in ("t", "u")]
        user = get_user_model().objects.create_user("u")
        for team in teams:
            Membership.objects.create(user=user, team=team)
        rs = [services.submit(user, rules.ReservationSpec(team=teams[i % 2], image="busybox:1.36",
                                                          gpu_request=Decimal("0.5"), gpu_memory_mib=100))
              for i in range(4)]
        g = Gpu.objects.order_by("pk").first()
        services.place_many([[services.Placing(r.pk, g.node_id, (services.NewAllocation(g.pk, Decimal("0.5"), 100),))]
                             for r in rs[:2]])
        print(same_as_the_orm([t.pk for t in teams]) == len(PARAMETERISED) * 4)
    """)
    assert lines[-1] == "True"


def test_one_statement_whatever_the_values(fleet, teams, people):
    rs = [_submit(people["alice"], teams["vision"], "0.25") for _ in range(3)]
    compiled = Precompiled(lambda: Reservation.objects.filter(param_in("pk", "ids")).order_by("pk")
                           .values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        assert compiled.all(ids=[r.pk for r in rs]) == [r.pk for r in rs]
        assert compiled.all(ids=[rs[1].pk]) == [rs[1].pk]
    assert len(queries) == 2


def test_an_empty_list_that_every_row_must_match_runs_nothing(fleet, teams, people):
    """As the ORM does for `pk__in=[]`; where the list is one of alternatives, the query runs."""
    r = _submit(people["alice"], teams["vision"], "0.25")
    both = Precompiled(lambda: Reservation.objects.filter(param_in("pk", "ids"), param_eq("team_id", "team"))
                       .values_list("pk", flat=True))
    either = Precompiled(lambda: Reservation.objects.filter(Q(param_in("pk", "ids")) | Q(param_eq("team_id", "team")))
                         .values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        assert both.all(ids=[], team=r.team_id) == list(Reservation.objects.filter(pk__in=[], team=r.team_id)) == []
    assert len(queries) == 0
    with CaptureQueriesContext(connection) as queries:
        assert either.all(ids=[], team=r.team_id) == [r.pk]
    assert len(queries) == 1


def test_parameters_are_named_and_all_given(fleet):
    compiled = Precompiled(lambda: Gpu.objects.filter(param_eq("node_id", "node"), param_in("pk", "ids"))
                           .values_list("pk", flat=True))
    for wrong in ({}, {"node": 1}, {"node": 1, "ids": [], "other": 2}, {"nodes": 1, "ids": []}):
        with pytest.raises(TypeError):
            compiled.all(**wrong)
    assert compiled.all(node=10**9, ids=[]) == []


@pytest.mark.django_db(transaction=True)  # outside the test's own transaction
def test_a_lock_needs_a_transaction_every_time(fleet):
    """select_for_update outside a transaction is refused, as the ORM refuses it, also once compiled."""
    compiled = Precompiled(lambda: Gpu.objects.select_for_update().filter(param_in("pk", "ids")).order_by("pk"))
    gpu = Gpu.objects.order_by("pk").first()
    with transaction.atomic():
        assert compiled.all(ids=[gpu.pk]) == [gpu]
    with pytest.raises(TransactionManagementError):
        compiled.all(ids=[gpu.pk])


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.django_db(transaction=True)
def test_locked_rows_stay_locked_until_the_commit(fleet):
    """FOR UPDATE is in the compiled statement: another connection cannot lock the rows meanwhile."""
    compiled = Precompiled(lambda: Gpu.objects.select_for_update().filter(param_in("pk", "ids")).order_by("pk"))
    first, second = Gpu.objects.order_by("pk")[:2]
    outcome: list[str] = []

    def other(pk: int) -> None:
        try:
            with transaction.atomic():
                list(Gpu.objects.select_for_update(nowait=True).filter(pk=pk))
            outcome.append("locked it")
        except DatabaseError:
            outcome.append("refused")
        finally:
            connections.close_all()

    with transaction.atomic():
        assert [g.pk for g in compiled.all(ids=[second.pk, first.pk])] == [first.pk, second.pk]  # id order
        for pk in (first.pk, second.pk):
            thread = threading.Thread(target=other, args=(pk,))
            thread.start()
            thread.join()
    assert outcome == ["refused", "refused"]
    thread = threading.Thread(target=other, args=(first.pk,))
    thread.start()
    thread.join()
    assert outcome[-1] == "locked it"
