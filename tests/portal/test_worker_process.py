"""What a Celery worker process sets up when it starts (portal.celery): its database connection
outlives a task, unless DB_CONN_MAX_AGE says otherwise, and what is loaded is out of the
collector's way."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import gc, json, os
import django
django.setup()
from celery import signals
from django.db import close_old_connections, connection
import portal.celery  # noqa: F401  (connects the worker signals)

getattr(signals, os.environ["PROBE_SIGNAL"]).send(sender=None)

def backend_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]

first = backend_pid()
close_old_connections()  # what Celery's Django fixup does after every task
print(json.dumps({"same_connection": backend_pid() == first, "frozen": gc.get_freeze_count() > 0,
                  "health_checks": connection.settings_dict["CONN_HEALTH_CHECKS"]}))
"""


def _probe(**env) -> dict:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("needs DATABASE_URL on PostgreSQL (pg_backend_pid tells connections apart)")
    full = dict(os.environ, DJANGO_SETTINGS_MODULE="portal.settings", PYTHONPATH=str(ROOT), **env)
    if "DB_CONN_MAX_AGE" not in env:
        full.pop("DB_CONN_MAX_AGE", None)
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("signal", ["worker_process_init", "worker_init"])  # prefork child; solo/threads pool
def test_a_worker_process_keeps_its_database_connection_between_tasks(signal):
    assert _probe(PROBE_SIGNAL=signal) == {"same_connection": True, "frozen": True, "health_checks": True}


def test_db_conn_max_age_set_by_the_operator_wins():
    got = _probe(DB_CONN_MAX_AGE="0", PROBE_SIGNAL="worker_process_init")
    assert got["same_connection"] is False  # closed after the task, as asked
    assert got["frozen"] is True
