"""The Celery app: placement cycles, binds, lifecycle and reconcile run in its workers.

`celery -A portal worker` runs tasks, `celery -A portal beat` sends the periodic ones. Without
REDIS_URL tasks run in-process (CELERY_TASK_ALWAYS_EAGER) and `manage.py placement_loop` stands in
for beat.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    # Tasks are short and idempotent; a worker that dies mid-task leaves them to another worker.
    task_acks_late=False,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 300},
    task_ignore_result=True,
    beat_schedule={
        "placement-cycle": {"task": "placement.cycle", "schedule": 15.0, "kwargs": {"reason": "periodic"}},
        "placement-sync": {"task": "placement.sync", "schedule": 2.0},
        "placement-lifecycle": {"task": "placement.lifecycle", "schedule": 20.0},
        "placement-reconcile": {"task": "placement.reconcile", "schedule": 30.0},
        "telemetry-maintain": {"task": "telemetry.maintain", "schedule": 30.0},
    },
)
app.autodiscover_tasks(["portal.placement", "portal.telemetry"])
