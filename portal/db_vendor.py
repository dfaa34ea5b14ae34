"""What differs between the two databases the portal runs on: PostgreSQL (production, the test
suite) and SQLite (the quickstart). This is the one place that asks which one a connection is;
the rest calls `of(connection)` and uses what it gives, never `connection.vendor`.

Each operation has both answers side by side, so a change to one shows what the other does:
list parameters (one array on PostgreSQL, expanded placeholders elsewhere), many rows written
in one statement (unnest of arrays, or a VALUES list), COPY of raw rows, the newest row per key
(DISTINCT ON, or the maximum joined back), time buckets, a transaction-scoped lock, and the
fleet's version row kept by triggers (PostgreSQL only). Settings and migrations choose by the
engine where they must (they create the mode, they do not run in it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db.models import Field, Max, QuerySet
from django.db.models.expressions import RawSQL

from portal import internals


def array_literal(numbers) -> str:
    """A PostgreSQL array literal of numbers: one text parameter instead of one per element."""
    return "{" + ",".join(map(str, numbers)) + "}"


def _array_item(value) -> str:
    """An element of a PostgreSQL array literal: a number, a timestamp (quoted) or NULL."""
    if value is None:
        return "NULL"
    if isinstance(value, datetime):
        return f'"{value.isoformat()}"'
    return str(value)


class PostgreSQL:
    name = "postgresql"
    expands_in_lists = False  # a list is one array parameter: the statement's text never changes
    copies_text = True  # raw rows go as one block of COPY text
    # A libpq server: another connection (psycopg's, from an event loop) may pipeline prepared
    # statements to it (connect/recheck.py).
    pipelines = True

    @staticmethod
    def in_list_sql(lhs: str, field: Field, connection) -> str:
        cast = internals.cast_type(field, connection)
        return f"{lhs} = ANY(%s{f'::{cast}[]' if cast else ''})"

    @staticmethod
    def list_param(values: list) -> Any:
        if all(type(v) is int for v in values):
            # psycopg adapts a list element by element, which cost more than the rest of a one-id query.
            return array_literal(values)
        return values

    @staticmethod
    def typed_param(field: Field, connection) -> str:
        return f"%s::{field.db_type(connection)}"

    @staticmethod
    def rows_source(fields: Sequence[Field], names: Sequence[str], rows: list[list], connection
                    ) -> tuple[str, list, str, list]:
        """(prefix, its parameters, source, its parameters) of a statement reading `rows` as
        the relation `v(names)`: here the source is unnest() of one binary array per column."""
        source = "unnest(" + ", ".join(f"%b::{f.db_type(connection)}[]" for f in fields) + f") AS v({', '.join(names)})"
        return "", [], source, [list(column) for column in zip(*rows, strict=True)]

    @staticmethod
    @contextmanager
    def write_cursor(connection) -> Iterator[Any]:
        """Django's cursor, except that the statement is bound server-side with binary parameters:
        Django's psycopg cursor binds client-side, quoting every array element into the SQL text,
        which PostgreSQL then parses back (a third more time per statement in portal.bulk).
        Django still wraps it (execute wrappers, query log, its own exception classes)."""
        import psycopg

        with connection.cursor(), psycopg.Cursor(internals.dbapi_connection(connection)) as raw:
            yield internals.wrap_cursor(connection, raw)

    @staticmethod
    def update_by_id(connection, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence]) -> None:
        """Set `columns` ((name, SQL type) of numbers and timestamps) of each row by id (each row:
        id, then the columns' values): one statement over one text array per column, cheaper
        here than portal.bulk's prepared binary arrays for a few dozen rows of plain values."""
        qn = connection.ops.quote_name
        names = ", ".join(["id", *(qn(c) for c, _ in columns)])
        source = "unnest(" + ", ".join(f"%s::{t}[]" for t in ("bigint", *(t for _, t in columns))) + f") AS v({names})"
        sets = ", ".join(f"{qn(c)} = v.{qn(c)}" for c, _ in columns)
        arrays = ["{" + ",".join(map(_array_item, column)) + "}" for column in zip(*rows, strict=True)]
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {qn(table)} AS s SET {sets} FROM {source} WHERE s.id = v.id", arrays)  # noqa: S608

    @staticmethod
    def copy_text(connection, table: str, columns: Sequence[str], text: str) -> None:
        qn = connection.ops.quote_name
        names = ", ".join(qn(c) for c in columns)
        with connection.cursor() as cursor, \
                internals.dbapi_cursor(cursor).copy(f"COPY {qn(table)} ({names}) FROM STDIN") as copy:
            copy.write(text)

    @staticmethod
    def newest_per(qs: QuerySet, keys: Sequence[str], at: str, fields: Sequence[str]) -> list[dict]:
        return list(qs.order_by(*keys, f"-{at}").distinct(*keys).values(*fields))

    @staticmethod
    def epoch_bucket(column: str, bucket_s: int) -> RawSQL:
        # date_bin on the timestamp: no numeric division per row (extract(epoch) is numeric).
        return RawSQL(f"extract(epoch from date_bin(make_interval(secs => %s), {column}, "  # noqa: S611
                      "'1970-01-01 00:00:00+00'))::bigint", (bucket_s,))

    @staticmethod
    def lock_for_transaction(connection, name: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(2024, hashtext(%s))", [name])

    @staticmethod
    def versioned_row(connection, sql: str) -> tuple | None:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()


class SQLite:
    name = "sqlite"
    expands_in_lists = True  # `IN (%s)` becomes one placeholder per value at each call
    copies_text = False  # no COPY: raw rows go through the ORM
    pipelines = False

    @staticmethod
    def in_list_sql(lhs: str, field: Field, connection) -> str:
        return f"{lhs} IN (%s)"

    @staticmethod
    def list_param(values: list) -> Any:
        return values

    @staticmethod
    def typed_param(field: Field, connection) -> str:
        return "%s"

    @staticmethod
    def rows_source(fields: Sequence[Field], names: Sequence[str], rows: list[list], connection
                    ) -> tuple[str, list, str, list]:
        """Here the rows are a VALUES list in a WITH clause before the statement (SQLite 3.33+)."""
        row = "(" + ", ".join("%s" for _ in fields) + ")"
        prefix = f"WITH v({', '.join(names)}) AS (VALUES {', '.join([row] * len(rows))}) "
        return prefix, [value for values in rows for value in values], "v", []

    @staticmethod
    @contextmanager
    def write_cursor(connection) -> Iterator[Any]:
        with connection.cursor() as cursor:
            yield cursor

    @staticmethod
    def update_by_id(connection, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence]) -> None:
        """executemany of one prepared UPDATE per row."""
        qn = connection.ops.quote_name
        sets = ", ".join(f"{qn(c)} = %s" for c, _ in columns)
        with connection.cursor() as cursor:
            cursor.executemany(f"UPDATE {qn(table)} SET {sets} WHERE id = %s",  # noqa: S608
                               [(*row[1:], row[0]) for row in rows])

    @staticmethod
    def copy_text(connection, table: str, columns: Sequence[str], text: str) -> None:
        raise NotImplementedError("SQLite has no COPY: write the rows through the ORM (copies_text is False)")

    @staticmethod
    def newest_per(qs: QuerySet, keys: Sequence[str], at: str, fields: Sequence[str]) -> list[dict]:
        newest = {tuple(r[k] for k in keys): r["newest"] for r in qs.values(*keys).annotate(newest=Max(at))}
        return [r for r in qs.values(*fields) if newest.get(tuple(r[k] for k in keys)) == r[at]]

    @staticmethod
    def epoch_bucket(column: str, bucket_s: int) -> RawSQL:
        return RawSQL(f"(cast(strftime('%%s', {column}) as integer) / %s) * %s", (bucket_s, bucket_s))  # noqa: S611

    @staticmethod
    def lock_for_transaction(connection, name: str) -> None:
        """Nothing to take: SQLite runs one writing transaction at a time."""

    @staticmethod
    def versioned_row(connection, sql: str) -> tuple | None:
        """None: no trigger keeps a version here (the caller reads the rows themselves)."""
        return None


_VENDORS = {"postgresql": PostgreSQL, "sqlite": SQLite}


def of(connection) -> type[PostgreSQL] | type[SQLite]:
    """The operations of `connection`'s database."""
    try:
        return _VENDORS[connection.vendor]
    except KeyError:
        raise NotImplementedError(f"the portal runs on PostgreSQL or SQLite, not {connection.vendor}") from None
