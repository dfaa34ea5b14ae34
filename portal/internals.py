"""Every use of the frameworks' undocumented internals (Django 5.2, DRF 3.16, Celery), in one place.

A few hot paths skip work the public API always does: portal.precompiled compiles a queryset
once and runs its SQL with new values, portal.bulk and telemetry/sample_rows.py write many rows
in one statement, api/representation.py renders through fields built once, and
api/reservation_related.py and tenancy/authentication.py build model objects from their own SQL.
What they need from the frameworks beyond the documented API (`Model._meta`, `Model.from_db`,
`Model._state`, custom lookups, `Field.get_db_prep_value`/`from_db_value`, a cursor's `execute`)
is here, each behind a function named for what it gives, and nowhere else.

tests/portal/test_internals.py checks each against what the public API gives for the same
query, field or object, a test per function: an upgrade that changes an internal fails there,
named, not somewhere in production.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from django.db.models import Field, Lookup, QuerySet
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable, get_related_populators
from django.db.models.sql.where import AND, WhereNode
from rest_framework.fields import DateTimeField
from rest_framework.relations import PKOnlyObject, RelatedField

# --- querysets (portal.precompiled) ---------------------------------------------------------------

ROWS_INSTANCES, ROWS_TUPLES, ROWS_FLAT = "instances", "tuples", "flat"
_ROWS = {ModelIterable: ROWS_INSTANCES, ValuesListIterable: ROWS_TUPLES, FlatValuesListIterable: ROWS_FLAT}


def rows_of(qs: QuerySet) -> str | None:
    """What iterating `qs` yields: model instances, values_list tuples, flat values, or None for
    anything else (values() dicts, named tuples)."""
    return _ROWS.get(qs._iterable_class)


def plain_rows(qs: QuerySet) -> bool:
    """Whether `qs`'s rows are its SQL's rows alone: no prefetch_related, not a related
    manager's queryset (which sets the known parent on each object)."""
    return not (qs._prefetch_related_lookups or qs._known_related_objects)


def reads_for_write(qs: QuerySet) -> bool:
    """Whether `qs` reads from the write database (select_for_update), as `QuerySet.db` decides."""
    return qs._for_write


def locks_rows(qs: QuerySet, connection) -> bool:
    """Whether `qs` runs SELECT ... FOR UPDATE on `connection` (where the database has it)."""
    return bool(qs.query.select_for_update and connection.features.has_select_for_update
                and connection.features.supports_transactions)


class Instances(NamedTuple):
    """How Django's ModelIterable builds a row's model instance and its select_related ones."""

    model: type
    fields: list[str]  # the attnames of the model's selected columns
    start: int
    end: int
    related: list  # RelatedPopulator per select_related model
    annotations: dict[str, int]


class CompiledSelect(NamedTuple):
    sql: str
    params: list  # as the compiler gives them (a lookup's own objects where it put them)
    columns: int  # the queryset's own columns (the compiler may select more, e.g. for ordering)
    converters: list[tuple[int, list, Any]]  # (column, converters, expression), as the ORM applies them
    instances: Instances | None  # for a queryset of model instances


def compile_select(qs: QuerySet, alias: str) -> CompiledSelect:
    """The SELECT `qs` runs on database `alias`, and what the ORM does with its rows."""
    compiler = qs.query.get_compiler(using=alias)
    sql, params = compiler.as_sql()  # also sets compiler.select, klass_info, annotation_col_map
    columns = compiler.col_count
    selected = [s[0] for s in compiler.select[:columns]]
    if compiler.has_composite_fields(selected):
        raise TypeError("Precompiled takes no composite fields")
    converters = [(pos, convs, expression) for pos, (convs, expression) in compiler.get_converters(selected).items()]
    instances = None
    if rows_of(qs) == ROWS_INSTANCES:
        info = compiler.klass_info
        start, end = info["select_fields"][0], info["select_fields"][-1] + 1
        instances = Instances(info["model"], [s[0].target.attname for s in compiler.select[start:end]], start, end,
                              get_related_populators(info, compiler.select, alias),
                              dict(compiler.annotation_col_map or {}))
    return CompiledSelect(sql, list(params), columns, converters, instances)


def build_instances(how: Instances, alias: str, rows: list) -> list:
    """Model instances from rows, as ModelIterable makes them."""
    objs = []
    for row in rows:
        obj = how.model.from_db(alias, how.fields, row[how.start:how.end])
        for populator in how.related:
            populator.populate(row, obj)
        for name, pos in how.annotations.items():
            setattr(obj, name, row[pos])
        objs.append(obj)
    return objs


def required_lookups(qs: QuerySet) -> Iterator[Lookup]:
    """The lookups of `qs`'s WHERE clause that every row must match (its top-level AND)."""
    def walk(where) -> Iterator[Lookup]:
        if where.connector != AND or where.negated:
            return
        for child in where.children:
            if isinstance(child, WhereNode):
                yield from walk(child)
            elif isinstance(child, Lookup):
                yield child
    return walk(qs.query.where)


def cast_type(field: Field, connection) -> str | None:
    """The type `field`'s values are cast to in SQL (PostgreSQL's `::type`)."""
    return field.cast_db_type(connection)


# --- columns read by hand (tenancy/authentication.py) ---------------------------------------------

def column_converters(field: Field, alias: str, connection) -> list[Callable[[Any, Any], Any]]:
    """What the ORM applies to `field`'s column read from table alias `alias` (the backend's
    converters, then the field's from_db_value), each as a function of (value, connection)."""
    col = field.get_col(alias)
    found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
    return [lambda value, conn, convert=convert: convert(value, col, conn) for convert in found]


# --- related objects (api/reservation_related.py) --------------------------------------------------

class RelationCache(NamedTuple):
    """A relation field's cache on its model's instances, without the descriptor's checks (the
    foreign key column already holds the object's id): per row, as cheap as the field's own
    methods (these are they)."""

    holds: Callable[[Any], bool]  # holds(instance): the related object is there (select_related, or set)
    put: Callable[[Any, Any], None]  # put(instance, obj)


def relation_cache(field: Field) -> RelationCache:
    return RelationCache(field.is_cached, field.set_cached_value)


# --- cursors (portal.bulk, telemetry/sample_rows.py) -----------------------------------------------

def wrap_cursor(connection, raw):
    """Django's wrapper around a DB-API cursor of `connection`'s own connection: execute wrappers,
    the query log when it is on, Django's exception classes."""
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


def dbapi_connection(connection):
    """The driver's connection under Django's (opened by a `connection.cursor()` first)."""
    return connection.connection


def dbapi_cursor(cursor):
    """The driver's cursor under Django's cursor wrapper (psycopg's COPY)."""
    return cursor.cursor


# --- DRF fields (api/representation.py) -----------------------------------------------------------

def hands_out_pk_only(field) -> bool:
    """Whether a DRF related field reads only the related object's pk (a stand-in object)."""
    return isinstance(field, RelatedField) and field.use_pk_only_optimization()


# DRF's pk-only stand-in for a related object (what a related field's get_attribute may give).
PK_ONLY_OBJECT = PKOnlyObject


def is_missing_pk_only(value) -> bool:
    """Whether `value` is DRF's pk-only stand-in for a related object that is not there."""
    return isinstance(value, PK_ONLY_OBJECT) and value.pk is None


def default_datetime_output(field) -> bool:
    """Whether a DRF DateTimeField writes with the default format and time zone (its `format`
    and `timezone` attributes exist only when given)."""
    return type(field) is DateTimeField and not hasattr(field, "format") and not hasattr(field, "timezone")


# --- caches and Celery (api/throttling.py, portal.celery) ------------------------------------------

def redis_client(cache, key: str):
    """The redis-py client (and its connection pool) Django's RedisCache writes `key` with."""
    return cache._cache.get_client(key, write=True)


def drop_broker_connections(app) -> None:
    """Make a Celery app drop the connections and pools made for its previous broker (Celery
    does that itself only after a fork)."""
    app._after_fork()


def pool_threads(executor) -> int:
    """How many threads a ThreadPoolExecutor has started."""
    return len(executor._threads)
