"""Per request: does a remembered "this session's user owns this running app" still hold?

The first request of a session to an app is decided in full (access.target_for, through the ORM on
a worker thread: the session, the user, the reservation, the roles). Later ones only ask PostgreSQL,
in one prepared statement, whether what that decision read can have changed: the reservation still
runs, with the same owner, app, port and pod; the session still exists and has not expired; the user
is still active with the same password hash (a new password ends the user's other sessions). So a
reservation that ends, or passes to another owner, is refused on the next request, at once.

The statement runs on a connection of the proxy's own, driven from the event loop at libpq's level
in pipeline mode: each check is sent as it comes, concurrent checks share the connection, answers
come back in order. One round trip and a few dozen µs of CPU per request, instead of a thread hop,
a new connection and several ORM queries. Anything that goes wrong with it (the database restarts)
fails the pending checks; the caller then decides in full, and the next check connects again.
"""

from __future__ import annotations

import asyncio
import collections

import psycopg
from django.conf import settings
from django.db import connections
from psycopg import pq, sql

from portal import db_vendor

STATEMENT = b"tessera_connect_recheck"


def available() -> bool:
    """Only where the database is PostgreSQL and sessions are its rows (the default engine)."""
    return (db_vendor.of(connections["default"]).pipelines
            and settings.SESSION_ENGINE == "django.contrib.sessions.backends.db")


def _statement() -> sql.Composed:
    """PREPARE of the check (tables and columns named as the models name them)."""
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.models import Session

    from portal.reservations.models import Reservation

    r, u, s = Reservation, get_user_model(), Session
    names = {"reservations": sql.Identifier(r._meta.db_table), "users": sql.Identifier(u._meta.db_table),
             "sessions": sql.Identifier(s._meta.db_table), "statement": sql.Identifier(STATEMENT.decode())}
    for prefix, model, fields in (
            ("r", r, ("id", "state", "owner", "app", "app_port", "pod_namespace", "pod_name")),
            ("u", u, ("id", "is_active", "password")), ("s", s, ("session_key", "expire_date"))):
        names |= {f"{prefix}_{f}": sql.Identifier(prefix, model._meta.get_field(f).column) for f in fields}
    return sql.SQL(
        "PREPARE {statement} AS SELECT 1 FROM {reservations} r, {users} u, {sessions} s "
        "WHERE {r_id} = $1 AND {r_state} = $2 AND {r_owner} = $3 AND {r_app} = $4 AND {r_app_port} = $5 "
        "AND {r_pod_namespace} = $6 AND {r_pod_name} = $7 "
        "AND {u_id} = $3 AND {u_is_active} AND {u_password} = $8 "
        "AND {s_session_key} = $9 AND {s_expire_date} > now()").format(**names)


class RecheckFailed(Exception):
    """The check could not be made (the connection broke); decide in full instead."""


class Recheck:
    """One connection per event loop; `holds(params)` → whether the statement finds its row."""

    def __init__(self) -> None:
        self._conn: psycopg.AsyncConnection | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._connecting: asyncio.Future | None = None
        self._pending: collections.deque[tuple[asyncio.Future, list[bool]]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1  # the connection's socket (libpq no longer tells it once the connection broke)

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL server process of its connection (None: not connected now)."""
        return None if self._pgconn is None else self._pgconn.backend_pid

    async def holds(self, params: list[bytes]) -> bool:
        pgconn = self._pgconn or await self._connect()
        answer = self._loop.create_future()
        try:
            pgconn.send_query_prepared(STATEMENT, params)
            pgconn.pipeline_sync()
            if pgconn.flush():  # the socket's buffer is full (rare for a few hundred bytes): finish later
                self._loop.add_writer(self._fd, self._flush)
        except psycopg.Error as exc:
            self._broken(exc)
            raise RecheckFailed(str(exc)) from exc
        self._pending.append((answer, []))
        return await answer

    async def _connect(self) -> pq.abc.PGconn:
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        try:
            return await asyncio.shield(self._connecting)
        except (psycopg.Error, OSError) as exc:
            raise RecheckFailed(str(exc)) from exc
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _open(self) -> pq.abc.PGconn:
        params = connections["default"].get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
        conn = await psycopg.AsyncConnection.connect(autocommit=True, **params)
        await conn.execute(_statement())
        pgconn = conn.pgconn
        pgconn.nonblocking = 1
        pgconn.enter_pipeline_mode()
        self._loop = asyncio.get_running_loop()
        self._fd = pgconn.socket
        self._loop.add_reader(self._fd, self._readable)
        self._conn, self._pgconn = conn, pgconn
        return pgconn

    def _flush(self) -> None:
        try:
            if not self._pgconn.flush():
                self._loop.remove_writer(self._fd)
        except psycopg.Error as exc:
            self._broken(exc)

    def _readable(self) -> None:
        pgconn = self._pgconn
        try:
            pgconn.consume_input()
            # Per check: its rows' result, a separator (None), then the sync point that ends it.
            separators = 0
            while self._pending and not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    separators += 1
                    if separators > 1:  # nothing more in flight (cannot happen while checks wait)
                        break
                    continue
                separators = 0
                answer, found = self._pending[0]
                if result.status == pq.ExecStatus.PIPELINE_SYNC:
                    self._pending.popleft()
                    if not answer.done():
                        answer.set_result(bool(found) and found[0])
                elif result.status == pq.ExecStatus.TUPLES_OK:
                    found.append(result.ntuples > 0)
                else:  # an error (then the rest up to the sync is aborted): not a "yes"
                    found.append(False)
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the connection closed")
        except psycopg.Error as exc:
            self._broken(exc)

    def _broken(self, exc: Exception) -> None:
        """Fail what waits; the next check connects again."""
        if self._pgconn is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
        pending, self._pending = self._pending, collections.deque()
        for answer, _found in pending:
            if not answer.done():
                answer.set_exception(RecheckFailed(str(exc)))
        conn, self._conn, self._pgconn = self._conn, None, None
        if conn is not None:
            conn.pgconn.finish()

    def close(self) -> None:
        self._broken(psycopg.OperationalError("closed"))
