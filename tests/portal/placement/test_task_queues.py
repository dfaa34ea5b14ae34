"""Housekeeping (slow cluster I/O) has its own Celery queue: the cycle's workers in deploy/ do not
take it, one worker takes only it, and a worker started without -Q (the quickstart, the tests)
takes both, so housekeeping runs everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml

from portal.celery import DEFAULT_QUEUE, HOUSEKEEPING_QUEUE
from portal.celery import app as celery_app

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
QUEUE_REDIS_URL = "redis://127.0.0.1:6379/8"  # this test's own Redis database; flushed before and after


def _queue_of(task: str) -> str:
    return celery_app.amqp.router.route({}, task)["queue"].name


def _worker_queues() -> dict[str, set[str]]:
    """Each worker Deployment of deploy/ and the queues its `-Q` names."""
    out = {}
    for path in (DEPLOY / "portal").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc["kind"] != "Deployment":
                continue
            for container in doc["spec"]["template"]["spec"]["containers"]:
                command = container.get("command", [])
                if command[:4] == ["celery", "-A", "portal", "worker"]:
                    assert "-Q" in command, f"{doc['metadata']['name']} takes no -Q: it would take every queue"
                    out[doc["metadata"]["name"]] = set(command[command.index("-Q") + 1].split(","))
    return out


def test_housekeeping_goes_to_its_own_queue_and_the_cycle_to_the_default_one():
    assert _queue_of("placement.housekeeping") == HOUSEKEEPING_QUEUE
    for task in ("placement.cycle", "placement.bind_many", "placement.sync", "placement.lifecycle",
                 "placement.reconcile", "telemetry.maintain"):
        assert _queue_of(task) == DEFAULT_QUEUE, task


def test_a_worker_without_q_takes_both_queues():
    assert {q.name for q in celery_app.conf.task_queues} == {DEFAULT_QUEUE, HOUSEKEEPING_QUEUE}


def test_deployed_workers_split_the_queues_and_leave_none_unconsumed():
    workers = _worker_queues()
    assert workers["tessera-worker"] == {DEFAULT_QUEUE}
    assert workers["tessera-housekeeping"] == {HOUSEKEEPING_QUEUE}
    assert set().union(*workers.values()) == {q.name for q in celery_app.conf.task_queues}


def test_each_message_lands_in_its_own_queue_only():
    """Sent through a real Redis broker with no worker: a cycle waits in `celery`, a housekeeping
    in `housekeeping`, and neither in the other."""
    client = redis.Redis.from_url(QUEUE_REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("needs Redis on 127.0.0.1:6379")
    client.flushdb()
    send = ("from portal.placement import tasks\n"
            "tasks.cycle.delay(reason='test'); tasks.housekeeping.delay(); tasks.housekeeping.delay()\n")
    env = {**os.environ, "REDIS_URL": QUEUE_REDIS_URL, "CELERY_TASK_ALWAYS_EAGER": "0",
           "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + send], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert (client.llen(DEFAULT_QUEUE), client.llen(HOUSEKEEPING_QUEUE)) == (1, 2)
    finally:
        client.flushdb()
