"""The Celery app: placement cycles, binds, lifecycle and reconcile run in its workers.

`celery -A portal worker` runs tasks, `celery -A portal beat` sends the periodic ones. Without
REDIS_URL tasks run in-process (CELERY_TASK_ALWAYS_EAGER) and `manage.py placement_loop` stands in
for beat.

Two queues: `placement.housekeeping` (cluster I/O that may be slow: deleting ended pods, reading
kubectl pods) has its own, so it never waits behind cycles and binds nor holds them up. A worker
started without `-Q` consumes both (the quickstart, the tests); deploy/ runs the workers with
`-Q celery` and one housekeeping worker with `-Q housekeeping`.
"""

import gc
import os

from celery import Celery
from celery.signals import worker_init, worker_process_init, worker_process_shutdown
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

DEFAULT_QUEUE = "celery"  # cycles, binds, sync, lifecycle, reconcile, telemetry
HOUSEKEEPING_QUEUE = "housekeeping"

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    # A task is acknowledged when a worker takes it: a worker that dies mid-task loses that run.
    # Nothing waits on it being redelivered: every task is idempotent and the beat schedule below
    # runs the cycle, the sync, lifecycle and reconcile again within seconds, which redoes what a
    # lost run left undone.
    task_acks_late=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 300},
    task_ignore_result=True,
    task_default_queue=DEFAULT_QUEUE,
    # Each queue bound by its own name (left out, both would be bound with the key `celery`).
    task_queues=tuple(Queue(q, routing_key=q) for q in (DEFAULT_QUEUE, HOUSEKEEPING_QUEUE)),
    task_default_routing_key=DEFAULT_QUEUE,
    task_routes={"placement.housekeeping": {"queue": HOUSEKEEPING_QUEUE, "routing_key": HOUSEKEEPING_QUEUE}},
    beat_schedule={
        "placement-cycle": {"task": "placement.cycle", "schedule": 15.0, "kwargs": {"reason": "periodic"}},
        "placement-sync": {"task": "placement.sync", "schedule": 2.0},
        "placement-housekeeping": {"task": "placement.housekeeping", "schedule": 5.0},
        "placement-lifecycle": {"task": "placement.lifecycle", "schedule": 20.0},
        # Bookings start within 10 s of their window (then the cycle they request places them).
        "placement-bookings": {"task": "placement.bookings", "schedule": 10.0},
        "placement-reconcile": {"task": "placement.reconcile", "schedule": 30.0},
        "telemetry-maintain": {"task": "telemetry.maintain", "schedule": 30.0},
        "notifications-check": {"task": "notifications.check", "schedule": 60.0},
    },
)
app.autodiscover_tasks(["portal.placement", "portal.telemetry", "portal.notifications"])


def send_tasks_to(broker_url: str, *, eager: bool = False) -> dict:
    """From now on this process sends its tasks to `broker_url` (or runs them in process: eager), for
    tests and benchmarks that start their own workers; returns the arguments that switch back. The
    connections made for the previous broker are dropped (Celery does that itself only after a fork)."""
    previous = {"broker_url": app.conf.broker_url, "eager": app.conf.task_always_eager}
    # Keys with the CELERY_ namespace: the app reads them from the Django settings.
    app.conf.update(CELERY_BROKER_URL=broker_url, CELERY_TASK_ALWAYS_EAGER=eager)
    from portal import internals  # not at the top: this module loads before Django's settings

    internals.drop_broker_connections(app)
    return previous


@worker_init.connect  # the worker's main process: before the prefork pool forks, or with -P solo/threads
@worker_process_init.connect  # each prefork child
def _prepare_worker_process(**_) -> None:
    from django.db import connections

    # A worker thread runs one task at a time: keep its database connection
    # between tasks (a new PostgreSQL connection costs 5-8 ms, and a burst of placements is a
    # dozen short tasks); the settings check it before reuse. DB_CONN_MAX_AGE, when set, wins.
    # A pool (the web processes' DB_POOL_MAX_SIZE) is no use to one task at a time, and its
    # threads would not survive the prefork pool's fork: workers keep a plain connection instead.
    for alias in connections:
        connections[alias].settings_dict.get("OPTIONS", {}).pop("pool", None)
    from django.conf import settings

    max_age = settings.TESSERA_WORKER_CONN_MAX_AGE_S
    for alias in connections:
        connections[alias].settings_dict["CONN_MAX_AGE"] = max_age
    # Django, the apps and their libraries live as long as the process: keep them out of the
    # cyclic collector's full passes, which otherwise walk all of them (~75 ms) in the middle of
    # a placement cycle that allocates a few thousand rows' worth of objects.
    gc.freeze()


@worker_process_shutdown.connect
def _flush_pushes(**_) -> None:
    from portal.telemetry.background_sends import sender

    sender.flush(2.0)  # agents' notifications still in flight go out before the process ends
