"""Queries compiled by the ORM once per process, then run with named parameters.

The placement cycle and the bind run a few dozen queries per submit whose SQL is always the same
apart from a team or a list of ids. Building and compiling one through the ORM costs 0.3-2 ms of
CPU, more than PostgreSQL takes to answer it. `Precompiled` builds the queryset and compiles it on
first use, then runs that SQL through Django's cursor (statements are still wrapped, logged and
counted as usual), converts the values read back as the ORM would (`from_db_value`, the backend's
and the expressions' converters) and, for a queryset of model instances, builds them as Django's
ModelIterable does (`Model.from_db`, then the select_related objects). So the rows are what
`list(queryset)` gives.

A parameter is a filter the queryset names instead of a value:

    _HELD = Precompiled(lambda: Allocation.objects.filter(param_in("reservation_id", "ids"))
                        .order_by("pk").values_list("gpu_id", flat=True))
    _HELD.all(ids=[3, 5])

`param_eq(field, name)` is `field = value`; `param_in(field, name)` is `field` in a list: one
array parameter on PostgreSQL (`= ANY(%s::bigint[])`, the same text whatever the list's length),
`IN (%s, %s, ...)` expanded per call elsewhere (SQLite, where `IN ()` is valid and matches
nothing). Values are prepared by the column's field, as the ORM prepares a filter's values. An
empty list that every row must match runs nothing and gives no rows, as `pk__in=[]` does. They
are for filter(), not exclude(): negated, they would not get the ORM's care of NULL columns.
A select_for_update queryset keeps its FOR UPDATE and ORDER BY (the lock order) and is refused
outside a transaction at every call, as the ORM refuses it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from django.db import connections, router
from django.db.models import F, Field, Lookup, QuerySet
from django.db.transaction import TransactionManagementError

from portal import db_vendor, internals

# Where Django's SQLite backend finds the placeholders it turns into `?`.
_PLACEHOLDER = re.compile(r"(?<!%)%s")


class _Slot(NamedTuple):
    """A named parameter's place among a statement's parameters."""

    name: str
    field: Field  # prepares the value(s) as the ORM would for this column
    many: bool

    def bind(self, value: Any, connection) -> Any:
        prep = self.field.get_db_prep_value
        if not self.many:
            return prep(value, connection, prepared=False)
        return db_vendor.of(connection).list_param([prep(v, connection, prepared=False) for v in value])


class _Param(Lookup):
    """`field = <name>`: a filter whose value is given to `Precompiled.all(name=...)`."""

    prepare_rhs = False
    many = False

    def __init__(self, field: str, name: str) -> None:
        super().__init__(F(field), name)

    def as_sql(self, compiler, connection):
        lhs, params = compiler.compile(self.lhs)
        slot = _Slot(self.rhs, self.lhs.output_field, self.many)
        if not self.many:
            return f"{lhs} = %s", (*params, slot)
        # SQLite's `IN (%s)` is expanded to one placeholder per value when run
        return db_vendor.of(connection).in_list_sql(lhs, self.lhs.output_field, connection), (*params, slot)


class _ParamIn(_Param):
    """`field` in the list `<name>`."""

    many = True


def param_eq(field: str, name: str) -> Lookup:
    """A filter for a Precompiled queryset: `field` equals the parameter `name` (None matches
    nothing, as in SQL; the ORM's `field=None` is `IS NULL`)."""
    return _Param(field, name)


def param_in(field: str, name: str) -> Lookup:
    """A filter for a Precompiled queryset: `field` is one of the parameter `name` (a list)."""
    return _ParamIn(field, name)


class _Compiled(NamedTuple):
    sql: str
    params: tuple  # the constant parameters, a _Slot where a named one goes
    slots: tuple[tuple[int, _Slot], ...]
    names: frozenset[str]
    required: frozenset[str]  # lists without which no row matches: empty, nothing is run (as the ORM does)
    pieces: tuple[str, ...] | None  # the SQL split at its placeholders where lists are expanded (not PostgreSQL)
    for_update: bool
    columns: int  # the queryset's own columns (the compiler may select more, e.g. for ordering)
    converters: list[tuple[int, list, Any]]  # (column, converters, expression), as the ORM applies them
    flat: bool
    instances: internals.Instances | None

    def bind(self, values: dict[str, Any], connection) -> tuple[str, list]:
        if values.keys() != self.names:
            raise TypeError(f"this query takes the parameters {sorted(self.names)}, not {sorted(values)}")
        params = list(self.params)
        for pos, slot in self.slots:
            params[pos] = slot.bind(values[slot.name], connection)
        if self.pieces is None:
            return self.sql, params
        sql, flat = [self.pieces[0]], []
        for param, piece, original in zip(params, self.pieces[1:], self.params, strict=True):
            if isinstance(original, _Slot) and original.many:
                sql.append(", ".join(["%s"] * len(param)))
                flat.extend(param)
            else:
                sql.append("%s")
                flat.append(param)
            sql.append(piece)
        return "".join(sql), flat


class Precompiled:
    """`make()` returns a queryset of model instances or a `values_list` one (flat or not) whose
    filters are constants or named parameters (`param_eq`, `param_in`)."""

    def __init__(self, make: Callable[[], QuerySet]) -> None:
        self._make = make
        self._model = None
        self._for_write = False
        self._compiled: dict[str, _Compiled] = {}  # per database alias
        self._lock = threading.Lock()

    def _compile(self, alias: str) -> _Compiled:
        qs = self._make().using(alias)
        rows = internals.rows_of(qs)
        if rows is None:
            raise TypeError("Precompiled takes a queryset of model instances or a values_list one")
        if not internals.plain_rows(qs):
            raise TypeError("Precompiled takes no prefetch_related nor a related manager's queryset")
        connection = connections[alias]
        select = internals.compile_select(qs, alias)
        sql, params = select.sql, select.params
        slots = tuple((pos, p) for pos, p in enumerate(params) if isinstance(p, _Slot))
        pieces = None
        if db_vendor.of(connection).expands_in_lists and any(slot.many for _, slot in slots):
            pieces = tuple(_PLACEHOLDER.split(sql))
            if len(pieces) != len(params) + 1:
                raise TypeError("Precompiled could not find each parameter's placeholder in the SQL")
        for_update = internals.locks_rows(qs, connection)
        names = frozenset(slot.name for _, slot in slots)
        required = frozenset(lookup.rhs for lookup in internals.required_lookups(qs) if isinstance(lookup, _ParamIn))
        return _Compiled(sql, tuple(params), slots, names, required, pieces, for_update, select.columns,
                         select.converters, rows == internals.ROWS_FLAT, select.instances)

    def all(self, **params: Any) -> list[Any]:
        """The rows, as `list(make())` would give them, with these values for its parameters."""
        if self._model is None:
            qs = self._make()
            self._for_write = internals.reads_for_write(qs)
            self._model = qs.model
        alias = (router.db_for_write if self._for_write else router.db_for_read)(self._model)
        compiled = self._compiled.get(alias)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(alias) or self._compile(alias)
                self._compiled[alias] = compiled
        connection = connections[alias]
        sql, args = compiled.bind(params, connection)
        if compiled.required and not all(params[name] for name in compiled.required):
            return []
        if compiled.for_update and connection.get_autocommit():  # the compiler's check, each time
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        with connection.cursor() as cursor:
            cursor.execute(sql, args)
            rows = cursor.fetchall()
        if compiled.converters:
            converted = []
            for row in rows:
                row = list(row[:compiled.columns])
                for pos, convs, expression in compiled.converters:
                    value = row[pos]
                    for convert in convs:
                        value = convert(value, expression, connection)
                    row[pos] = value
                converted.append(row)
            rows = converted
        if compiled.instances is not None:
            return internals.build_instances(compiled.instances, alias, rows)
        if compiled.flat:
            return [row[0] for row in rows]
        return [tuple(row[:compiled.columns]) if len(row) != compiled.columns or compiled.converters else row
                for row in rows]
