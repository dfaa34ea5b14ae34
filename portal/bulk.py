"""Write many rows in one statement, passing one array per column.

Django's `bulk_update` builds one CASE expression per field holding a WHEN per row; compiling it
costs rows × fields expression objects (about 9 s for 1,000 reservations × 14 fields here), and
`bulk_create` prepares every value of every object. A placement cycle commits hundreds of
decisions at once, so it writes them with these instead:

    PostgreSQL: UPDATE t SET a = v.a, b = %s FROM unnest(%s::bigint[], %s::int[]) AS v(id, a) WHERE t.id = v.id
                INSERT INTO t (a, b) SELECT v.a, %s FROM unnest(%s::int[]) AS v(a)
    SQLite:     the same with WITH v(id, a) AS (VALUES (?, ?), ...) in place of unnest (3.33+)

Only the columns whose values differ between rows travel as arrays; the ones the same for every
row (`same`) are one parameter each. On PostgreSQL the statement's text is the same whatever the
number of rows, so psycopg parses it once. Values go through each field's `get_db_prep_save`, as
`save()` would. What differs between the two databases is portal.db_vendor's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections, router
from django.db.models import Model

from portal import db_vendor

BATCH = 500


def update_rows(objs: Sequence[Model], fields: Sequence[str], same: Mapping[str, Any] | None = None,
                match: Sequence[str] = (), batch_size: int = BATCH) -> int:
    """Write `fields` of each object to its row (by primary key), and `same` (field → value) to
    all of them; with `match`, only rows whose columns still hold the object's values of those
    fields (a compare-and-set). Returns the rows changed."""
    if not objs:
        return 0
    meta = type(objs[0])._meta
    attnames = [meta.get_field(name).attname for name in (*fields, *match)]
    rows = [[obj.pk, *(getattr(obj, a) for a in attnames)] for obj in objs]
    return update_values(type(objs[0]), fields, rows, same, match, batch_size)


def update_values(model: type[Model], fields: Sequence[str], rows: Sequence[Sequence[Any]],
                  same: Mapping[str, Any] | None = None, match: Sequence[str] = (), batch_size: int = BATCH) -> int:
    """`update_rows` from plain values, without model instances: each row is (primary key, the
    values of `fields`, then those of `match`)."""
    same = dict(same or {})
    if not rows or not (fields or same):
        return 0
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields), *(meta.get_field(name) for name in match)]
    constants = [(meta.get_field(name), value) for name, value in same.items()]
    return _write(model, "update", columns, rows, constants, batch_size, matched=len(match))


def insert_rows(model: type[Model], fields: Sequence[str], rows: Sequence[Sequence[Any]],
                same: Mapping[str, Any] | None = None, batch_size: int = BATCH) -> int:
    """Insert one row per item of `rows` (values in the order of `fields`), each also with `same`.
    No primary keys come back and no signals are sent. Returns the rows inserted."""
    if not rows:
        return 0
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    constants = [(meta.get_field(name), value) for name, value in (same or {}).items()]
    return _write(model, "insert", columns, rows, constants, batch_size)


def _write(model: type[Model], verb: str, columns: list, rows: Sequence[Sequence[Any]], constants: list,
           batch_size: int, matched: int = 0) -> int:
    """`matched`: how many of the last columns are compared in the WHERE clause, not written."""
    connection = connections[router.db_for_write(model)]
    vendor = db_vendor.of(connection)
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    names = [qn(f"c{i}") for i in range(len(columns))]
    const_params = [f.get_db_prep_save(value, connection=connection) for f, value in constants]
    const_sql = [vendor.typed_param(f, connection) for f, _ in constants]
    done = 0
    with vendor.write_cursor(connection) as cursor:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            values = [[f.get_db_prep_save(v, connection=connection) for f, v in zip(columns, row, strict=True)]
                      for row in batch]
            prefix, prefix_params, source, source_params = vendor.rows_source(columns, names, values, connection)
            if verb == "update":
                key = qn(columns[0].column)
                written = len(columns) - matched
                sets = [f"{qn(f.column)} = v.{names[i]}" for i, f in enumerate(columns[:written]) if i]
                sets += [f"{qn(f.column)} = {sql}" for (f, _), sql in zip(constants, const_sql, strict=True)]
                where = [f"{table}.{key} = v.{names[0]}"]
                where += [f"{table}.{qn(f.column)} = v.{names[written + i]}" for i, f in enumerate(columns[written:])]
                sql = f"{prefix}UPDATE {table} SET {', '.join(sets)} FROM {source} WHERE {' AND '.join(where)}"  # noqa: S608
            else:
                targets = [qn(f.column) for f in columns] + [qn(f.column) for f, _ in constants]
                picks = [f"v.{n}" for n in names] + const_sql
                sql = f"{prefix}INSERT INTO {table} ({', '.join(targets)}) SELECT {', '.join(picks)} FROM {source}"  # noqa: S608
            # Table and column names above are the model's own; every value is a parameter, in the
            # order of the text: the prefix's (SQLite's WITH), the constants, the source's (unnest).
            cursor.execute(sql, [*prefix_params, *const_params, *source_params])
            done += cursor.rowcount
    return done
