"""`Authorization: Token <key>` against hashed per-user API tokens.

Every API request pays for this lookup, so it is one statement written once, not an ORM query
compiled per request (that took ~2 ms of CPU, the statement ~0.2): the token, its user, whether
the user is a demo user (demo.refused) and the user's team roles (roles.team_roles, which would
otherwise be a query of its own). All of it is read fresh on each request, so a revoked token, a
deactivated user or a removed membership counts from the next request on.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import connections, router
from django.utils import timezone
from rest_framework import authentication, exceptions

from portal import db_vendor, internals
from portal.security import demo

from . import roles
from .models import ApiToken, Membership, hash_secret

# Touch last_used_at at most this often so reads don't turn into a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenQuery:
    """The lookup's statement and the decoding of its rows, built from the models' metadata once
    per database connection settings (vendor), the way the ORM would decode the same columns."""

    def __init__(self, connection):
        User = get_user_model()
        qn = connection.ops.quote_name
        self.token_fields = ApiToken._meta.concrete_fields
        self.user_fields = User._meta.concrete_fields
        groups = User.groups.through
        group = groups._meta.get_field("group").related_model
        token, user, membership = (qn(model._meta.db_table) for model in (ApiToken, User, Membership))
        user_groups, group_table = qn(groups._meta.db_table), qn(group._meta.db_table)
        t_user, t_key_hash, t_revoked_at, t_last_used_at = (
            qn(ApiToken._meta.get_field(name).column) for name in ("user", "key_hash", "revoked_at", "last_used_at"))
        m_user, m_team, m_role = (qn(Membership._meta.get_field(name).column) for name in ("user", "team", "role"))
        ug_user, ug_group = (qn(groups._meta.get_field(name).column) for name in ("user", "group"))
        u_pk, g_pk = qn(User._meta.pk.column), qn(group._meta.pk.column)
        g_name = qn(group._meta.get_field("name").column)
        columns = ", ".join([f"t.{qn(f.column)}" for f in self.token_fields]
                            + [f"u.{qn(f.column)}" for f in self.user_fields])
        # Every name in the statement comes from the models' metadata.
        self.sql = (
            f"SELECT {columns},"  # noqa: S608
            f" EXISTS (SELECT 1 FROM {user_groups} ug JOIN {group_table} g ON g.{g_pk} = ug.{ug_group}"
            f" WHERE ug.{ug_user} = t.{t_user} AND g.{g_name} = %s),"
            f" m.{m_team}, m.{m_role}"
            f" FROM {token} t JOIN {user} u ON u.{u_pk} = t.{t_user}"
            f" LEFT JOIN {membership} m ON m.{m_user} = t.{t_user}"
            f" WHERE t.{t_key_hash} = %s AND t.{t_revoked_at} IS NULL ORDER BY m.{m_team}")
        t_pk = qn(ApiToken._meta.pk.column)
        self.last_used_at = ApiToken._meta.get_field("last_used_at")
        self.touch_sql = f"UPDATE {token} SET {t_last_used_at} = %s WHERE {t_pk} = %s"  # noqa: S608
        # (position in the row, its converters): what the ORM applies to the same columns (none
        # on PostgreSQL; SQLite's datetimes and booleans need them).
        self.converters = []
        for offset, alias, fields in ((0, "t", self.token_fields), (len(self.token_fields), "u", self.user_fields)):
            for i, field in enumerate(fields):
                found = internals.column_converters(field, alias, connection)
                if found:
                    self.converters.append((offset + i, found))

    def fetch(self, connection, key_hash: str) -> tuple[ApiToken, bool, dict[int, str]] | None:
        """(token with its user, whether the user is a demo user, team id → role) or None."""
        with connection.cursor() as cursor:
            cursor.execute(self.sql, [demo.DEMO_GROUP, key_hash])
            rows = cursor.fetchall()
        if not rows:
            return None
        values = list(rows[0])
        for i, found in self.converters:
            for convert in found:
                values[i] = convert(values[i], connection)
        n_token, n_user = len(self.token_fields), len(self.user_fields)
        token = ApiToken.from_db(connection.alias, [f.attname for f in self.token_fields], values[:n_token])
        user = get_user_model().from_db(connection.alias, [f.attname for f in self.user_fields],
                                        values[n_token:n_token + n_user])
        token.user = user
        team_roles = {row[-2]: row[-1] for row in rows if row[-2] is not None}
        return token, bool(values[n_token + n_user]), team_roles

    def touch(self, connection, token: ApiToken, now) -> None:
        with connection.cursor() as cursor:
            cursor.execute(self.touch_sql, [self.last_used_at.get_db_prep_value(now, connection), token.pk])


_queries: dict[tuple[str, str], TokenQuery] = {}
_queries_lock = threading.Lock()


def token_query(connection) -> TokenQuery:
    key = (connection.alias, db_vendor.of(connection).name)
    query = _queries.get(key)
    if query is None:
        with _queries_lock:
            query = _queries.setdefault(key, TokenQuery(connection))
    return query


class HashedTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key: str):
        connection = connections[router.db_for_read(ApiToken)]
        query = token_query(connection)
        found = query.fetch(connection, hash_secret(key))
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        token, is_demo, team_roles = found
        token.user.is_demo_user = is_demo
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        if demo.refused(token.user):
            raise exceptions.AuthenticationFailed("Demo users work only in demo mode.")
        roles.remember_roles(token.user, team_roles)
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            query.touch(connection, token, now)
        return token.user, token
