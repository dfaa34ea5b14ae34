"""portal.internals: each use of the frameworks' internals still gives what the public API gives
for the same query, field or object. A failure here after an upgrade names the internal that
changed; fix it in portal/internals.py, the only place that uses it."""

from __future__ import annotations

import datetime
import os
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import psycopg
import pytest
from celery import Celery
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.db.models import Count, Prefetch, Q
from django.test.utils import CaptureQueriesContext
from rest_framework import serializers

from portal import internals
from portal.fleet.models import Gpu, Node
from portal.reservations.models import Reservation
from portal.reservations.rules import ReservationSpec
from portal.reservations.services import submit

pytestmark = pytest.mark.django_db

REDIS_URL = f"redis://127.0.0.1:6379/{int(os.environ.get('TESSERA_TEST_REDIS_DB', '7'))}"


def _reservation(person, team) -> Reservation:
    return submit(person, ReservationSpec(team=team, image="img", gpu_request=Decimal("0.5"), gpu_memory_mib=1024))


def test_rows_of_tells_instances_tuples_and_flat_values_apart(db):
    assert internals.rows_of(Node.objects.all()) == internals.ROWS_INSTANCES
    assert internals.rows_of(Node.objects.values_list("name")) == internals.ROWS_TUPLES
    assert internals.rows_of(Node.objects.values_list("name", flat=True)) == internals.ROWS_FLAT
    assert internals.rows_of(Node.objects.values("name")) is None
    assert internals.rows_of(Node.objects.values_list("name", named=True)) is None


def test_plain_rows_refuses_prefetches_and_related_managers(fleet):
    node = Node.objects.first()
    assert internals.plain_rows(Gpu.objects.all())
    assert not internals.plain_rows(Node.objects.prefetch_related(Prefetch("gpus")))
    assert not internals.plain_rows(node.gpus.all())


def test_reads_for_write_and_locks_rows_follow_select_for_update(db):
    assert not internals.reads_for_write(Node.objects.all())
    assert internals.reads_for_write(Node.objects.select_for_update())
    assert internals.locks_rows(Node.objects.select_for_update(), connection) == \
        connection.features.has_select_for_update
    assert not internals.locks_rows(Node.objects.all(), connection)


def _run(select: internals.CompiledSelect) -> list[list]:
    with connection.cursor() as cursor:
        cursor.execute(select.sql, select.params)
        rows = [list(row) for row in cursor.fetchall()]
    for row in rows:
        for pos, convs, expression in select.converters:
            for convert in convs:
                row[pos] = convert(row[pos], expression, connection)
    return rows


def test_compiled_select_gives_the_orms_rows_and_instances(fleet, teams, people):
    _reservation(people["alice"], teams["vision"])
    tuples = Node.objects.order_by("name").values_list("name", "labels")  # JSON: a converter
    select = internals.compile_select(tuples, "default")
    assert select.instances is None
    assert [tuple(row[:select.columns]) for row in _run(select)] == list(tuples)

    instances = (Reservation.objects.select_related("team").annotate(n=Count("allocations")).order_by("pk"))
    select = internals.compile_select(instances, "default")
    built = internals.build_instances(select.instances, "default", _run(select))
    expected = list(instances)
    assert [(r.pk, r.gpu_request, r.created_at, r.n) for r in built] == \
        [(r.pk, r.gpu_request, r.created_at, r.n) for r in expected]
    with CaptureQueriesContext(connection) as queries:
        assert [r.team.slug for r in built] == [r.team.slug for r in expected]
    assert not queries  # select_related populated


def test_required_lookups_are_the_top_level_and(db):
    both = Node.objects.filter(name="a", status__in=["ready"])
    assert sorted(lookup.lookup_name for lookup in internals.required_lookups(both)) == ["exact", "in"]
    assert list(internals.required_lookups(Node.objects.filter(Q(name="a") | Q(name="b")))) == []
    assert list(internals.required_lookups(Node.objects.exclude(name="a"))) == []


def test_cast_type_is_the_columns_sql_type(db):
    cast = internals.cast_type(Node._meta.pk, connection)
    assert cast == Node._meta.pk.db_type(connection).split()[0].lower() or cast is None


def test_column_converters_decode_as_the_orm_does(fleet):
    field = Node._meta.get_field("labels")  # JSON: from_db_value on every backend
    node = Node.objects.exclude(labels={}).order_by("pk").first() or Node.objects.order_by("pk").first()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n.{connection.ops.quote_name(field.column)} FROM {Node._meta.db_table} n "
                       "WHERE n.id = %s", [node.pk])
        value = cursor.fetchone()[0]
    for convert in internals.column_converters(field, "n", connection):
        value = convert(value, connection)
    assert value == node.labels


def test_cached_relations_are_what_the_descriptor_reads(fleet, teams, people):
    made = _reservation(people["alice"], teams["vision"])
    cache = internals.relation_cache(Reservation._meta.get_field("team"))
    plain = Reservation.objects.get(pk=made.pk)
    assert not cache.holds(plain)
    assert cache.holds(Reservation.objects.select_related("team").get(pk=made.pk))
    cache.put(plain, teams["vision"])
    assert cache.holds(plain)
    with CaptureQueriesContext(connection) as queries:
        assert plain.team is teams["vision"]
    assert not queries


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's own cursor")
def test_a_wrapped_driver_cursor_is_logged_like_djangos(db):
    with connection.cursor() as cursor:
        assert hasattr(internals.dbapi_cursor(cursor), "copy")  # psycopg's COPY
    with CaptureQueriesContext(connection) as queries, \
            psycopg.Cursor(internals.dbapi_connection(connection)) as raw:
        internals.wrap_cursor(connection, raw).execute("SELECT %s", [41])
        assert raw.fetchone() == (41,)
    assert [q["sql"] for q in queries] == ["SELECT $1"]  # logged as the driver bound it, server-side


class _Owned(serializers.ModelSerializer):
    class Meta:
        model = Reservation
        fields = ("client_node", "created_at")


def test_drf_field_internals(fleet, teams, people):
    fields = _Owned().fields
    assert internals.hands_out_pk_only(fields["client_node"])
    assert not internals.hands_out_pk_only(serializers.StringRelatedField())
    missing = fields["client_node"].get_attribute(_reservation(people["alice"], teams["vision"]))
    assert internals.is_missing_pk_only(missing)
    assert not internals.is_missing_pk_only(None)
    assert internals.default_datetime_output(fields["created_at"])
    assert not internals.default_datetime_output(serializers.DateTimeField(format="%Y"))
    assert not internals.default_datetime_output(serializers.DateTimeField(default_timezone=datetime.UTC))


def test_redis_client_is_the_one_django_writes_with():
    cache = RedisCache(REDIS_URL, {"KEY_PREFIX": "internals-test"})
    key = cache.make_and_validate_key("k")
    client = internals.redis_client(cache, key)
    try:
        client.set(key, b"7")  # Django's serializer stores an int as its digits
    except Exception as exc:
        pytest.fail(f"this test needs Redis at {REDIS_URL}: {exc}")
    try:
        assert cache.get("k") == 7
    finally:
        cache.delete("k")


def test_drop_broker_connections_gives_a_new_pool_for_the_new_broker():
    app = Celery(broker="memory://first", set_as_current=False)  # the portal's app stays the current one
    before = app.pool
    app.conf.broker_url = "memory://second"
    internals.drop_broker_connections(app)
    assert app.pool is not before
    with app.pool.acquire() as conn:
        assert conn.as_uri().startswith("memory://second")


def test_pool_threads_counts_the_started_threads():
    with ThreadPoolExecutor(max_workers=2) as executor:
        assert internals.pool_threads(executor) == 0
        executor.submit(int).result()
        assert internals.pool_threads(executor) >= 1
