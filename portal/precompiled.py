"""Read queries whose SQL and parameters never change, compiled by the ORM once per process.

A placement cycle runs a dozen such queries (the queue, the live shares, the pods per node, each
team's quota use) every time. Building and compiling one through the ORM costs 0.3-2 ms of CPU,
more than PostgreSQL takes to answer it, and the worker paid that on every submit and cancel.
`Precompiled` builds the queryset and compiles it on first use, then runs that SQL through
Django's cursor (statements are still wrapped, logged and counted as usual) and converts the
values read back as the ORM would (`from_db_value`, the backend's and the expressions' converters).
So the rows are what `list(queryset)` gives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from django.db import connections, router
from django.db.models import QuerySet
from django.db.models.query import FlatValuesListIterable, ValuesListIterable


class _Compiled(NamedTuple):
    sql: str
    params: tuple
    columns: int  # the queryset's own columns (the compiler may select more, e.g. for ordering)
    converters: list[tuple[int, list, Any]]  # (column, converters, expression), as the ORM applies them
    flat: bool


class Precompiled:
    """`make()` returns a `values_list` queryset (flat or not) with constant filters."""

    def __init__(self, make: Callable[[], QuerySet]) -> None:
        self._make = make
        self._model = None
        self._compiled: dict[str, _Compiled] = {}  # per database alias
        self._lock = threading.Lock()

    def _compile(self, alias: str) -> _Compiled:
        qs = self._make().using(alias)
        if qs._iterable_class not in (ValuesListIterable, FlatValuesListIterable):
            raise TypeError("Precompiled takes a values_list queryset")
        compiler = qs.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        columns = compiler.col_count
        converters = compiler.get_converters([s[0] for s in compiler.select[:columns]])
        return _Compiled(sql, tuple(params), columns,
                         [(pos, convs, expression) for pos, (convs, expression) in converters.items()],
                         qs._iterable_class is FlatValuesListIterable)

    def all(self) -> list[Any]:
        """The rows, as `list(make())` would give them."""
        if self._model is None:
            self._model = self._make().model
        alias = router.db_for_read(self._model)
        compiled = self._compiled.get(alias)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(alias) or self._compile(alias)
                self._compiled[alias] = compiled
        connection = connections[alias]
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, compiled.params)
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
        if compiled.flat:
            return [row[0] for row in rows]
        return [tuple(row[:compiled.columns]) if len(row) != compiled.columns or compiled.converters else row
                for row in rows]
