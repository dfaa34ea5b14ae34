"""Suite-wide settings: tests run against the real PostgreSQL on this machine unless DATABASE_URL
says otherwise (the README's test command sets it)."""

import os

import pytest


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """One test database per pytest run (test_<name>_<pid>), so runs on one machine never drop each
    other's database. Server processes started by tests read the name from the connection settings."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        test = db.setdefault("TEST", {})
        test["NAME"] = f"{test.get('NAME') or 'test_' + db['NAME']}_{os.getpid()}"
