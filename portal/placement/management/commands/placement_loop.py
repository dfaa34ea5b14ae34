"""Run the placement app's periodic work in this process: what Celery beat and a worker do.

For the quickstart without Redis (tasks run in-process): `manage.py placement_loop` next to the web
server makes placed reservations start, batch ones finish, expired ones end and the cluster
reconcile. With Redis, run `celery -A portal worker` and `celery -A portal beat` instead.
"""

from __future__ import annotations

import logging
import signal
import time

from django.core.management.base import BaseCommand, CommandParser

from portal.placement import tasks

log = logging.getLogger(__name__)
HOUSEKEEPING_EVERY_S = 5.0  # as beat sends placement.housekeeping
BOOKINGS_EVERY_S = 10.0  # as beat sends placement.bookings
NOTIFICATIONS_EVERY_S = 60.0  # as beat sends notifications.check (waiting long, ending soon)


class Command(BaseCommand):
    help = "Run placement cycles, cluster housekeeping and events, lifecycle checks and reconcile in this process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cycle-every", type=float, default=15.0, help="seconds between periodic cycles")
        parser.add_argument("--lifecycle-every", type=float, default=20.0, help="seconds between expiry/idle checks")
        parser.add_argument("--reconcile-every", type=float, default=30.0, help="seconds between reconciles")
        parser.add_argument("--once", action="store_true", help="do each thing once and exit")

    def handle(self, *args, cycle_every: float, lifecycle_every: float, reconcile_every: float, once: bool,
               **options) -> None:
        for name, value in (("--cycle-every", cycle_every), ("--lifecycle-every", lifecycle_every),
                            ("--reconcile-every", reconcile_every)):
            if value <= 0:
                self.stderr.write(f"{name} must be greater than 0")
                raise SystemExit(2)
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        from portal.notifications.checks import run_checks

        due = {"reconcile": 0.0, "housekeeping": 0.0, "bookings": 0.0, "cycle": 0.0, "lifecycle": 0.0,
               "notifications": 0.0}
        every = {"reconcile": reconcile_every, "housekeeping": HOUSEKEEPING_EVERY_S, "bookings": BOOKINGS_EVERY_S,
                 "cycle": cycle_every, "lifecycle": lifecycle_every, "notifications": NOTIFICATIONS_EVERY_S}
        jobs = {"reconcile": tasks.reconcile, "housekeeping": tasks.housekeeping, "bookings": tasks.bookings,
                "cycle": lambda: tasks.run_cycles("periodic"), "lifecycle": tasks.lifecycle_checks,
                "notifications": run_checks}
        self.stdout.write("placement loop running (Ctrl-C to stop)")
        try:
            while not stop:
                now = time.monotonic()
                for name, when in due.items():
                    if now >= when:
                        self._run(name, jobs[name])
                        due[name] = now + every[name]
                # Blocks up to a second for cluster events; a pod that finished frees its GPUs, and
                # that change requests the next cycle by itself.
                self._run("sync", lambda: tasks.sync(timeout_s=0.0 if once else 1.0))
                if once:
                    break
        except KeyboardInterrupt:
            pass

    def _run(self, name: str, job):
        try:
            return job()
        except Exception:  # keep looping: the next round retries, as beat would
            log.exception("placement loop: %s failed", name)
            return None
