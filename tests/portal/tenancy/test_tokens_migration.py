"""tenancy 0010: the "cli" tokens each sign-in used to mint are kept, renamed apart (the newest
keeps its name), so one live token per name can be enforced without cutting any script off."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("tenancy", "0009_connect")]
AFTER = [("tenancy", "0010_tokens")]


@pytest.fixture
def executor(transactional_db):
    executor = MigrationExecutor(connection)
    yield executor
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def migrate(executor: MigrationExecutor, target):
    executor.loader.build_graph()
    executor.migrate(target)
    return MigrationExecutor(connection).loader.project_state(target).apps


def test_duplicate_live_token_names_are_renamed_apart_and_none_is_revoked(executor):
    apps = migrate(executor, BEFORE)
    User, ApiToken = apps.get_model("auth", "User"), apps.get_model("tenancy", "ApiToken")
    alice, bob = User.objects.create(username="alice"), User.objects.create(username="bob")
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    for i in range(3):
        ApiToken.objects.create(user=alice, name="cli", prefix=f"a{i}", key_hash=f"a{i}")
    ApiToken.objects.create(user=alice, name="cli", prefix="rv", key_hash="rv", revoked_at=t0)
    ApiToken.objects.create(user=bob, name="cli", prefix="b0", key_hash="b0")
    for i, token in enumerate(ApiToken.objects.filter(user=alice).order_by("prefix")):
        ApiToken.objects.filter(pk=token.pk).update(created_at=t0 + timedelta(days=i))

    apps = migrate(executor, AFTER)
    ApiToken = apps.get_model("tenancy", "ApiToken")
    names = dict(ApiToken.objects.values_list("prefix", "name"))
    assert names == {"a2": "cli", "a1": "cli (2)", "a0": "cli (3)", "rv": "cli", "b0": "cli"}
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 4
